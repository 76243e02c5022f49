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


async def _exchange(port: int, send: bytes, pause_s: float = 0.0) -> bytes:
    """What the listener answers ``send`` (after ``pause_s``) until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    await asyncio.sleep(pause_s)
    writer.write(send)
    await writer.drain()
    out = await asyncio.wait_for(reader.read(), 10)  # to EOF: the server closed
    writer.close()
    return out


def test_a_late_or_oversized_request_head_is_answered_and_its_connection_closed():
    async def main() -> dict[str, bytes]:
        listener = DirectListener(
            _app, "127.0.0.1", 0, head_timeout_s=0.3, max_head_bytes=4096
        ).start()
        p = listener.port
        try:
            return {
                # connects and sends nothing; sends half a head; a head too large
                "silent": await _exchange(p, b""),
                "partial": await _exchange(p, b"POST /v1/x HTTP/1.1\r\nhost: a\r\nx-a: "),
                "large": await _exchange(
                    p, b"GET /v1/x HTTP/1.1\r\nx-big: " + b"a" * 8192 + b"\r\n\r\n"
                ),
                # one header value that never ends: refused before it is whole
                "endless": await _exchange(p, b"GET /v1/x HTTP/1.1\r\nx-big: " + b"a" * 8192),
                # a whole request after the deadline of the connection's first head: too late
                "slow_start": await _exchange(p, _post(b"/v1/y", close=True), 0.5),
                # a request, a pause past the head deadline (within the keep-alive), another:
                # both answered (each head its own deadline, from its first byte)
                "kept": await _kept(p),
            }
        finally:
            listener.close()
            await asyncio.wait_for(listener.closed(), 10)

    out = asyncio.run(main())
    for k in ("silent", "partial"):
        assert out[k].startswith(b"HTTP/1.1 408 "), out[k][:80]
        assert out[k].endswith(b'"type":"RequestTimeout"}'), out[k][-80:]
    for k in ("large", "endless"):
        assert out[k].startswith(b"HTTP/1.1 400 "), out[k][:80]
    assert out["slow_start"].startswith(b"HTTP/1.1 408 ")
    assert out["kept"].count(b"HTTP/1.1 200 ") == 2 and b"/v1/b 2" in out["kept"]


def _post(path: bytes, close: bool = False) -> bytes:
    return b"POST %s HTTP/1.1\r\ncontent-length: 2\r\n%s\r\nzz" % (
        path,
        b"connection: close\r\n" if close else b"",
    )


async def _kept(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_post(b"/v1/a"))
    first = await asyncio.wait_for(reader.readuntil(b"/v1/a 2"), 10)
    await asyncio.sleep(0.5)
    writer.write(_post(b"/v1/b", close=True))
    rest = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return first + rest


def test_at_most_max_ongoing_requests_are_in_the_app_and_the_others_wait_unread():
    """Serve's per-replica cap on its own path holds on this one: 6 uploads of 1 MiB against
    a cap of 2 -- two in the app at a time, the others' bodies not yet read, every one
    answered in the end."""
    size = 1 << 20
    read: list[int] = []  # the body bytes the app has read, request by request
    gate = asyncio.Event()

    async def slow_app(scope, receive, send):
        n = 0
        while True:
            m = await receive()
            n += len(m.get("body", b""))
            if not m.get("more_body"):
                break
        read.append(n)
        await gate.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(n).encode()})

    async def main() -> tuple[list[int], list[int], int, int]:
        listener = DirectListener(slow_app, "127.0.0.1", 0, max_ongoing=2).start()
        base = f"http://127.0.0.1:{listener.port}"
        try:
            async with httpx.AsyncClient(timeout=30) as c:
                calls = [
                    asyncio.ensure_future(c.post(f"{base}/v1/u{i}", content=b"u" * size))
                    for i in range(6)
                ]
                while len(read) < 2:
                    await asyncio.sleep(0.01)
                for _ in range(20):  # the others have sent what the socket takes: no third in
                    await asyncio.sleep(0.02)
                held = list(read)
                inside = listener.ongoing.inside
                gate.set()
                answers = await asyncio.gather(*calls)
            return held, [int(r.text) for r in answers], inside, listener.ongoing.most
        finally:
            listener.close()
            await asyncio.wait_for(listener.closed(), 10)

    held, answered, inside, most = asyncio.run(main())
    assert held == [size, size] and inside == 2
    assert answered == [size] * 6
    assert most == 2
