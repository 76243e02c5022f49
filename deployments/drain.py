"""Draining an application's ingress before the application is deleted (``deployments.stop``).

``serve.delete`` stops every deployment of an application at once. Each replica finishes the
requests it holds, but a request still on its way through the pipeline -- in the ingress's
coalescer, or answered by Preprocess and not yet sent to Inference -- finds no replica
downstream and ends in Serve's plain 500. So ``stop`` first raises the application's drain
flag in Ray's key-value store; every ingress replica polls it from its start (``Drain.run``),
and from then on refuses new requests with 503 + ``Retry-After`` (``Unavailable``, reason
``draining``; its readiness turns false) and reports how many requests it still holds. When
every live ingress replica -- one whose report is fresh -- says it drains and holds none, the
application is deleted with nothing in the pipeline.

The flag carries the time it expires (the stop's longest wait and a margin), so a flag left
by a stop that died does not drain the application deployed again under the same name.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ray import serve
from ray.experimental import internal_kv

from pipeline.errors import Unavailable

logger = logging.getLogger(__name__)
NAMESPACE = "ferry"
POLL_S = 0.5  # how often an ingress replica reads the flag and reports
LIVE_S = 5.0  # a replica whose last report is older than this is a replica gone


def flag_key(app: str) -> bytes:
    return b"drain\0" + app.encode()


def report_prefix(app: str) -> bytes:
    return b"busy\0" + app.encode() + b"\0"


@dataclass
class Report:
    """What one ingress replica last said: whether it drains, the requests it holds, when."""

    draining: bool
    in_flight: int
    at: float

    def encode(self) -> bytes:
        return f"{int(self.draining)} {self.in_flight} {self.at:.3f}".encode()

    @classmethod
    def decode(cls, raw: bytes) -> Report:
        d, n, at = raw.decode().split()
        return cls(d == "1", int(n), float(at))


class Drain:
    """One per ingress replica: counts the requests it holds (``work``), refuses new ones
    once the flag is up, and reports (``run``, in the replica's event loop from its
    constructor, or from its first request where the constructor has no loop). ``kv`` is
    (get, put): Ray's internal key-value store in a replica; tests pass a dict's."""

    def __init__(
        self,
        app: str,
        replica: str,
        kv: tuple[Callable[[bytes], bytes | None], Callable[[bytes, bytes], Any]],
        retry_after_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app, self.replica = app, replica
        self.get, self.put = kv
        self.retry_after_s = retry_after_s
        self.clock = clock
        self.draining = False
        self.in_flight = 0
        self._key = report_prefix(app) + replica.encode()  # where this replica reports
        self._task: asyncio.Task | None = None

    @contextlib.contextmanager
    def work(self, request_id: str = "") -> Iterator[None]:
        """Hold one request; ``Unavailable`` (503, retry elsewhere) while draining."""
        if self.draining:
            raise Unavailable(
                "the application is stopping; retry",
                reason="draining",
                retry_after_s=self.retry_after_s,
                request_id=request_id,
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    def seen(self, raw: bytes | None) -> None:
        """The flag as read: an unexpired one starts the drain, for good."""
        if not self.draining and raw is not None and float(raw.decode()) > self.clock():
            self.draining = True
            logger.warning("draining: the application is being stopped")

    def report(self) -> bytes:
        return Report(self.draining, self.in_flight, self.clock()).encode()

    def poll(self) -> None:
        """Read the flag, then report (one round of ``run``, without the loop)."""
        self.seen(self.get(flag_key(self.app)))
        self.put(self._key, self.report())

    def start(self) -> None:
        """Poll in the running event loop from now on (once; nothing without a loop)."""
        if self._task is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._task = loop.create_task(self.run())

    async def run(self) -> None:
        while True:
            try:  # only the store's calls in a thread: the flag and the count stay the loop's
                self.seen(await asyncio.to_thread(self.get, flag_key(self.app)))
                await asyncio.to_thread(self.put, self._key, self.report())
            except Exception as exc:  # the store may be briefly away; the next poll tries again
                logger.debug("drain poll failed: %s", exc)
            await asyncio.sleep(POLL_S)


def for_this_replica(retry_after_s: float) -> Drain:
    """This replica's drain, keyed by its application and replica id (outside a Serve
    replica -- a test building the class -- a drain nobody flags)."""
    try:
        ctx = serve.get_replica_context()
        return Drain(ctx.app_name, ctx.replica_tag, ray_kv(), retry_after_s)
    except Exception:
        return Drain("", "local", (lambda _k: None, lambda _k, _v: None), retry_after_s)


def drained(reports: list[Report], now: float) -> bool:
    """Every live ingress replica (one that reported within ``LIVE_S``: they report every
    ``POLL_S``) has seen the flag and holds nothing."""
    live = [r for r in reports if r.at >= now - LIVE_S]
    return all(r.draining and r.in_flight == 0 for r in live)


class RayKv:
    """Ray's internal key-value store in Ferry's namespace: what the drain reads and writes."""

    def __init__(self) -> None:

        self._kv = internal_kv

    def get(self, key: bytes) -> bytes | None:
        return self._kv._internal_kv_get(key, namespace=NAMESPACE)

    def put(self, key: bytes, value: bytes) -> Any:
        return self._kv._internal_kv_put(key, value, overwrite=True, namespace=NAMESPACE)

    def keys(self, prefix: bytes) -> list[bytes]:
        return self._kv._internal_kv_list(prefix, namespace=NAMESPACE)

    def delete(self, key: bytes, by_prefix: bool = False) -> Any:
        return self._kv._internal_kv_del(key, del_by_prefix=by_prefix, namespace=NAMESPACE)


def ray_kv() -> tuple[Callable[[bytes], bytes | None], Callable[[bytes, bytes], Any]]:
    """A replica's ``(get, put)`` of the store (``Drain`` takes no more)."""
    kv = RayKv()
    return kv.get, kv.put


def drain_app(app: str, timeout_s: float = 60.0) -> bool:
    """Raise ``app``'s flag and wait until its live ingress replicas hold nothing (True), or
    ``timeout_s`` passes (False). Needs a connected Ray."""
    kv = RayKv()
    t0 = time.monotonic()
    kv.put(flag_key(app), f"{time.time() + timeout_s + 30.0:.3f}".encode())  # when it expires
    while time.monotonic() - t0 < timeout_s:
        time.sleep(POLL_S)
        if time.monotonic() - t0 < 2 * POLL_S:
            continue  # every live replica has polled since the flag went up
        reports = []
        for k in kv.keys(report_prefix(app)):
            raw = kv.get(k)
            if raw is not None:
                reports.append(Report.decode(raw))
        if drained(reports, time.time()):  # (none at all: no Ferry ingress polls)
            return True
    return False


def forget(app: str) -> None:
    """Drop ``app``'s flag and reports (after it is deleted, or its stop failed)."""
    kv = RayKv()
    kv.delete(flag_key(app))
    kv.delete(report_prefix(app), by_prefix=True)
