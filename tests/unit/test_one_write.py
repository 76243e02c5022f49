"""deployments/one_write.py on a real uvicorn server (both of its HTTP/1.1 protocols) and a real
socket: every answer whole and in one socket write, keep-alive, HEAD, a streamed answer, a
connection not kept alive, and an app that fails after its headers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest
import uvicorn

from deployments import one_write


class _Counted:
    """The connection's transport, each write recorded (what reaches the socket)."""

    def __init__(self, real: Any, log: list[bytes]) -> None:
        self._real, self._log = real, log

    def write(self, data: bytes) -> None:
        self._log.append(bytes(data))
        self._real.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _counting(base: type, log: list[bytes]) -> type:
    class Counting(base):  # type: ignore[misc, valid-type]
        def connection_made(self, transport: Any) -> None:
            super().connection_made(_Counted(transport, log))

    return Counting


async def app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    body = b'{"answer": "%s"}' % path.encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    if path == "/fail":
        raise RuntimeError("the app fails after its headers")
    await send({"type": "http.response.body", "body": body})


@pytest.fixture(params=["httptools", "h11"])
def server(request: Any) -> Any:
    if request.param == "httptools":
        pytest.importorskip("httptools")
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base
    assert one_write.install()
    log: list[bytes] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app, http=_counting(base, log), lifespan="off", log_level="critical", access_log=False
    )
    srv = uvicorn.Server(config)
    srv.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    t = threading.Thread(target=lambda: asyncio.run(srv.serve(sockets=[sock])), daemon=True)
    t.start()
    for _ in range(500):  # started: an event, not a time bound
        if srv.started:
            break
        time.sleep(0.01)
    assert srv.started
    yield sock.getsockname()[1], log
    srv.should_exit = True
    t.join(10)


def _exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` and read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(raw)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out


def _get(path: str, last: bool = False, method: str = "GET") -> bytes:
    close = b"connection: close\r\n" if last else b""
    return b"%s %s HTTP/1.1\r\nhost: x\r\n%s\r\n" % (method.encode(), path.encode(), close)


def test_keep_alive_answers_are_whole_and_one_write_each(server: Any) -> None:
    port, log = server
    out = _exchange(port, _get("/a") + _get("/b") + _get("/c", last=True))
    answers = out.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert len(answers) == 3
    for name, answer in zip("abc", answers, strict=True):
        head, _, body = answer.partition(b"\r\n\r\n")
        assert body == b'{"answer": "/%s"}' % name.encode()
        assert b"content-length: %d" % len(body) in head.lower()
    # one write an answer, each holding its status line, headers and body
    assert len(log) == 3
    assert [w.startswith(b"HTTP/1.1 200 OK\r\n") for w in log] == [True] * 3
    assert b"".join(log) == out


def test_head_and_a_streamed_answer(server: Any) -> None:
    port, log = server
    out = _exchange(port, _get("/h", method="HEAD") + _get("/stream", last=True))
    head_answer, stream_answer = out.split(b"HTTP/1.1 200 OK\r\n")[1:]
    assert head_answer.endswith(b"\r\n\r\n")  # headers only
    assert b"transfer-encoding: chunked" in stream_answer.lower()
    assert stream_answer.endswith(b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n")
    # HEAD: one write; the stream: its headers with its first chunk, then a write for each
    # later chunk and for the end (h11 also writes an empty one: not a system call)
    writes = [w for w in log if w]
    assert len(writes) == 1 + 4
    assert writes[1].startswith(b"HTTP/1.1 200 OK\r\n") and writes[1].endswith(b"4\r\none,\r\n")
    assert b"".join(log) == out


def test_an_app_that_fails_after_its_headers_closes_the_connection(server: Any) -> None:
    port, log = server
    out = _exchange(port, _get("/fail"))  # returns: the server closed the connection
    # as uvicorn does without the patch: the headers went out, then the connection closed
    assert out.startswith(b"HTTP/1.1 200 OK\r\n") and out.endswith(b"\r\n\r\n")
    assert b"".join(log) == out


def test_a_class_unlike_uvicorns_is_left_alone() -> None:
    class NotUvicorn:
        async def send(self, message: Any) -> None:
            self.sock.sendall(message["body"])  # type: ignore[attr-defined]

    assert not one_write._fits(NotUvicorn)
