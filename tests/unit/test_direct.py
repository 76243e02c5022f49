"""Ferry's own HTTP listener (``deployments/direct.py``): a shared port, real sockets, real
HTTP through uvicorn in a running event loop."""

from __future__ import annotations

import asyncio
import errno
import socket

import httpx
import pytest

from deployments.direct import DirectListener, bind


async def _app(scope, receive, send):
    """A tiny ASGI app: echoes the request's path and body length."""
    assert scope["type"] == "http"
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    out = f"{scope['path']} {len(body)}".encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": out})


def test_two_listeners_share_a_port_and_a_plain_socket_on_it_is_named_in_the_error():
    a = bind("127.0.0.1", 0)
    port = a.getsockname()[1]
    b = bind("127.0.0.1", port)  # a second replica of the node: SO_REUSEPORT
    try:
        assert b.getsockname()[1] == port
    finally:
        a.close()
        b.close()
    plain = socket.socket()  # a socket without SO_REUSEPORT holds the port alone
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    try:
        with pytest.raises(OSError) as err:
            bind("127.0.0.1", plain.getsockname()[1])
        assert err.value.errno == errno.EADDRINUSE
        assert f"ingress.direct_port: cannot listen on 127.0.0.1:{plain.getsockname()[1]}" in str(
            err.value
        )
    finally:
        plain.close()


def test_the_listener_serves_in_the_running_loop_then_closes_its_port():
    async def main() -> tuple[list[str], int]:
        listener = DirectListener(_app, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{listener.port}"
        async with httpx.AsyncClient() as c:
            answers = await asyncio.gather(
                *(c.post(f"{base}/v1/x{i}", content=b"z" * i) for i in range(5))
            )
        listener.check()  # listening: healthy
        listener.close()
        await asyncio.wait_for(listener.closed(), 10)
        listener.check()  # closed on purpose: still no error
        died = DirectListener(_app, "127.0.0.1", 0).start()
        await asyncio.sleep(0.05)
        died.task.cancel()  # ended without a close: Serve's health check must hear of it
        await asyncio.wait({died.task})
        with pytest.raises(RuntimeError, match="the listener has stopped"):
            died.check()
        with socket.socket() as s:
            refused = s.connect_ex(("127.0.0.1", listener.port))
        return [r.text for r in answers if r.status_code == 200], refused

    texts, refused = asyncio.run(main())
    assert texts == [f"/v1/x{i} {i}" for i in range(5)]
    assert refused == errno.ECONNREFUSED
