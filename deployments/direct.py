"""Ferry's own HTTP listener in each ingress replica (``ingress.direct_port``), beside Serve's.

A request through Serve's HTTP path crosses HAProxy (or Serve's proxy) and then Serve's
request handling in the replica (its request context, router bookkeeping and metrics) before
the app sees it: on the 2-core development machine Serve's floor -- a replica that reads the
body and answers a fixed JSON -- costs 0.2-0.27 ms of CPU a request across HAProxy, its
manager and the replica (``benchmarks/results/profile_pipeline.json``, ``serve_floor``), as
much as Ferry's own work a request. With ``direct_port``
set, every ingress replica also runs uvicorn on its own event loop -- the loop Serve runs the
app's code on, so the replica's state (coalescers, inboxes) stays one loop's -- serving the
very ASGI app Serve serves (``FerryApp``, with this replica in its state: every route, its
errors, auth and metrics), on a socket bound with ``SO_REUSEPORT``: the node's ingress
replicas share the port and the kernel spreads new connections over them (by a hash of the
connection's addresses: a handful of long-lived connections may land unevenly).

What Serve's path does that this one does not: Serve's own request metrics
(``serve_num_http_requests``; Ferry's ``ferry_requests_total`` counts both paths), its
per-request routing to the least loaded replica (here a connection stays on the replica that
accepted it), and its proxy's health view: a replica Serve stops closes its listener first
(``close``), and a connection still open to it gets answers until it ends. Two applications
that name the same port on one node would share it (``SO_REUSEPORT`` joins sockets of the
same user): give each its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)


class GuardedHttp(HttpToolsProtocol):
    """uvicorn's httptools protocol with the two bounds HAProxy puts before Serve's path (which
    uvicorn alone lacks): a request's head -- its line and headers -- must be complete within
    ``head_timeout_s`` of the connection or of its first byte, else 408 and the connection
    closes (a client that connects and sends nothing, or its headers a byte at a time, holds
    no connection for long); and it may be at most ``max_head_bytes``, else 400 and the
    connection closes (no header grows a replica's memory). The body's own bounds are the
    ingress's (``uploads.py``: idle and total time, size)."""

    head_timeout_s = 10.0
    max_head_bytes = 64 << 10

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._head_bytes = self._head_raw = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.write(LATE)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # a head still incomplete after these bytes: they all count against its bound (the
        # parser holds a header's partial value until it ends, so the parsed count is late)
        if self._head_timer is not None and not self.transport.is_closing():
            self._head_raw += len(data)
            if self._head_raw > self.max_head_bytes:
                self.send_400_response(f"Request head over {self.max_head_bytes} bytes.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = self._head_raw = 0
        self._arm()  # (a kept-alive connection's next request: its head's own deadline)

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value))
        super().on_header(name, value)

    def _count(self, n: int) -> None:
        self._head_bytes += n
        if self._head_bytes > self.max_head_bytes:  # the parser stops: uvicorn's 400, closed
            raise ValueError(f"request head over {self.max_head_bytes} bytes")

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


_LATE_BODY = b'{"error":"the request head did not arrive in time","type":"RequestTimeout"}'
LATE = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_LATE_BODY), _LATE_BODY)
)
"""What a connection whose request head is late gets before it closes (the body's own 408s
are Ferry's ``RequestTimeout``, from ``uploads.py``)."""


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: the replica's process is Ray's."""

    @contextlib.contextmanager
    def capture_signals(self) -> Any:
        yield


def bind(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A listening TCP socket on (``host``, ``port``) that other processes of this user may
    bind too (``SO_REUSEPORT``); an ``OSError`` naming the port where it is taken otherwise."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno, f"ingress.direct_port: cannot listen on {host}:{port}: {exc.strerror}"
        ) from None
    return sock


class Ongoing:
    """An ASGI wrapper that lets at most ``limit`` requests into ``app`` at once, as Serve's
    ``max_ongoing_requests`` does on its own path: the others wait, their bodies unread (uvicorn
    stops reading a connection whose unread body passes 64 KiB), as HAProxy queues
    the requests a replica has no slot for. Without it a burst of large uploads on this port
    would all be read into the replica's memory at once."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.slots = asyncio.Semaphore(limit)
        self.inside = 0  # (requests in the app now; ``most``: the most at once so far)
        self.most = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async with self.slots:
            self.inside += 1
            self.most = max(self.most, self.inside)
            try:
                await self.app(scope, receive, send)
            finally:
                self.inside -= 1


class DirectListener:
    """uvicorn serving ``app`` on a shared port, in the running event loop, at most
    ``max_ongoing`` requests in it at once (``Ongoing``; None: no bound)."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        keep_alive_s: float = 5.0,
        head_timeout_s: float = GuardedHttp.head_timeout_s,
        max_head_bytes: int = GuardedHttp.max_head_bytes,
        max_ongoing: int | None = None,
    ) -> None:
        self.sock = bind(host, port)  # here, not in the task: a taken port fails the replica
        self.port = self.sock.getsockname()[1]
        self.ongoing = None if max_ongoing is None else Ongoing(app, max_ongoing)
        bounds = {"head_timeout_s": head_timeout_s, "max_head_bytes": max_head_bytes}
        config = uvicorn.Config(
            app if self.ongoing is None else self.ongoing,
            http=type("GuardedHttp", (GuardedHttp,), bounds),
            lifespan="off",  # (Serve ran the app's lifespan)
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # (no proxy in front: no X-Forwarded-* to trust, a layer less)
            timeout_keep_alive=keep_alive_s,
            timeout_graceful_shutdown=10,
        )
        self.server = _Server(config)
        self.task: asyncio.Task | None = None

    def start(self) -> DirectListener:
        """Serve from now on, on the running loop (the loop Serve runs the app's code on)."""
        self.task = asyncio.get_running_loop().create_task(self._serve())
        return self

    async def _serve(self) -> None:
        try:
            await self.server.serve(sockets=[self.sock])
        except Exception:  # a crash here leaves Serve's path working: say it, do not hide it
            logger.exception("ingress.direct_port %d: the listener stopped", self.port)
            raise

    def close(self) -> None:
        """Stop accepting (within uvicorn's tick, 0.1 s: the port's other replicas take the new
        connections) and end the open ones once their requests are answered (uvicorn's
        graceful shutdown, at most 10 s)."""
        self.server.should_exit = True

    def check(self) -> None:
        """Raise where the listener ended though nobody closed it (Serve's health check: the
        replica is replaced, its port's other replicas serve meanwhile)."""
        if self.task is not None and self.task.done() and not self.server.should_exit:
            raise RuntimeError(f"ingress.direct_port {self.port}: the listener has stopped")

    async def closed(self) -> None:
        """After ``close``: until the listener has ended (its open requests answered)."""
        if self.task is not None:
            await asyncio.wait({self.task})
