"""Request bodies read under a bound: slow or stalled clients cost a replica little and
never block the requests behind them.

Where a stalled body waits (Ray Serve 2.60): with Serve's own proxy, the proxy calls the
ingress replica as soon as the headers are in and the replica pulls the body through
actor calls back to the proxy (``ASGIReceiveProxy.fetch_until_disconnect`` ->
``receive_asgi_messages``); with HAProxy in front, each ingress replica runs its own HTTP
server (direct ingress) and the body arrives on the replica's own event loop. Either way
the wait is in the replica's ``receive()``, holding one of its ``max_ongoing_requests``
slots: 520 clients that declare a body and send 10 bytes filled them all, so classify and
health queued behind them. So the bound lives here, in the replica:

* a body that is complete within ``grace_s`` of the request reaching the replica -- nearly
  every body: it comes with the headers or right after -- is read without further ado
  (where not a byte has come by then and no upload slot is free, the first bytes get one
  more ``grace_s``: through Serve's proxy the replica fetches them with an actor call,
  which a flood of requests slows);
* one still arriving after that needs an upload slot, of which a replica has
  ``max_uploads``: without a free one the request gets 503 with ``Retry-After`` at once
  (the replica's slots stay free for health and for requests whose bodies come, and a
  stalled client holds one for ``2 * grace_s`` at most);
* a body that makes no progress for ``idle_s``, or is not complete ``total_s`` after its
  first read, gets 408 and ``Connection: close``.

Headers are read before the replica sees the request, by the proxy (uvicorn, which does
not time them out) or by HAProxy (``timeout http-request``); a connection stalled in its
headers holds a socket there and no replica slot.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pipeline.coarse_timeout import within
from pipeline.errors import ClientClosedRequest, PayloadTooLarge, RequestTimeout, UploadsFull
from pipeline.protocol.validate import header_int


class UploadGate:
    """The bound on one replica's concurrent body reads and their deadlines. ``clock``: the
    seconds the deadlines are counted in (tests pass a virtual event loop's ``loop.time``,
    which ``coarse_timeout.within`` counts in too; ``time.monotonic`` is what a real loop
    uses)."""

    def __init__(
        self,
        max_uploads: int,
        idle_s: float,
        total_s: float,
        grace_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.max_uploads = max_uploads
        self.grace_s = grace_s
        self.idle_s = idle_s
        self.total_s = total_s
        self.active = 0
        self.refused = 0
        self.timed_out = 0

    async def read(self, request: Any, limit: int) -> bytes:
        """The whole body of ``request`` (a Starlette ``Request``): 413 over ``limit``,
        503 when ``max_uploads`` bodies are already being read, 408 when the client
        stalls."""
        declared = header_int(request.headers.get("content-length"), "Content-Length")
        if declared is not None and declared > limit:
            raise PayloadTooLarge("request body too large", bytes=declared, limit_bytes=limit)
        chunks: list[bytes] = []
        done = await self._read(request.receive, limit, chunks, self.grace_s, None)
        if not done and not chunks and self.active >= self.max_uploads:
            # not a byte yet: a client that sends none, or bytes that came with the headers
            # but whose fetch from Serve's proxy (an actor call) a flood of requests slowed
            # -- measured past 1 s under 1,000 stalled uploads on two cores: one more grace
            # for the first bytes before it is refused
            done = await self._read(request.receive, limit, chunks, self.grace_s, None)
        if done:
            return b"".join(chunks)
        if self.active >= self.max_uploads:  # a slow body, and no slot for it
            self.refused += 1
            raise UploadsFull(
                "too many slow uploads in progress on this replica",
                uploads=self.active,
                max_uploads=self.max_uploads,
                retry_after_s=1.0,
            )
        self.active += 1
        try:
            await self._read(request.receive, limit, chunks, self.total_s, self.idle_s)
        finally:
            self.active -= 1
        return b"".join(chunks)

    async def _read(
        self, receive: Any, limit: int, chunks: list[bytes], within_s: float, idle_s: float | None
    ) -> bool:
        """Read into ``chunks`` for up to ``within_s``; True when the body is complete. With
        ``idle_s`` (an upload slot held) running out of time or progress is a 408; without,
        running out of ``within_s`` returns False (the caller then wants a slot)."""
        total = sum(len(c) for c in chunks)
        end = self.clock() + within_s
        while True:
            left = end - self.clock()
            wait = left if idle_s is None else min(idle_s, left)
            try:
                if wait <= 0:
                    raise asyncio.TimeoutError
                with within(wait):  # (one sweep a loop for all of them: coarse_timeout)
                    msg = await receive()
            except asyncio.TimeoutError:
                if idle_s is None:
                    return False
                self.timed_out += 1
                raise RequestTimeout(
                    "the request body stopped arriving",
                    received_bytes=total,
                    idle_timeout_s=idle_s,
                    body_timeout_s=self.total_s,
                ) from None
            kind = msg.get("type")
            if kind == "http.disconnect":
                raise ClientClosedRequest("the client went away before its body ended", bytes=total)
            if kind != "http.request":
                continue
            body = msg.get("body", b"")
            if body:
                total += len(body)
                if total > limit:
                    raise PayloadTooLarge("request body too large", bytes=total, limit_bytes=limit)
                chunks.append(body)
            if not msg.get("more_body", False):
                return True
