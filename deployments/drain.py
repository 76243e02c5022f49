"""Draining an application's ingress before the application is deleted (``deployments.stop``).

``serve.delete`` stops every deployment of an application at once. Each replica finishes the
requests it holds, but a request still on its way through the pipeline -- in the ingress's
coalescer, or answered by Preprocess and not yet sent to Inference -- finds no replica
downstream and ends in Serve's plain 500. So ``stop`` first sets the application's drain flag
in Ray's key-value store; every ingress replica polls it (``Drain.run``), and from then on
refuses new requests with 503 + ``Retry-After`` (``Unavailable``, reason ``draining``; its
readiness turns false) and reports how many requests it still holds. When every ingress
replica has reported none, the application is deleted with nothing in the pipeline.

The flag carries the time it was set: a replica started after it (the application deployed
again under the same name) ignores it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.errors import Unavailable

logger = logging.getLogger(__name__)
NAMESPACE = "ferry"
POLL_S = 0.2  # how often an ingress replica reads the flag and reports
LIVE_S = 5.0  # a replica's report older than this (before the flag) is a replica gone


def flag_key(app: str) -> bytes:
    return f"drain:{app}".encode()


def report_prefix(app: str) -> bytes:
    return f"busy:{app}:".encode()


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
    once the flag is up, and reports (``run``, in the replica's event loop). ``kv`` is
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
        self.started = clock()
        self.draining = False
        self.in_flight = 0
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

    def poll(self) -> None:
        """Read the flag (one set before this replica started is an earlier stop's), then
        report."""
        if not self.draining:
            raw = self.get(flag_key(self.app))
            if raw is not None and float(raw.decode()) >= self.started:
                self.draining = True
                logger.warning("draining: the application is being stopped")
        report = Report(self.draining, self.in_flight, self.clock())
        self.put(report_prefix(self.app) + self.replica.encode(), report.encode())

    def start(self) -> None:
        """Poll in the running event loop from now on (once)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.poll)
            except Exception as exc:  # the store may be briefly away; the next poll tries again
                logger.debug("drain poll failed: %s", exc)
            await asyncio.sleep(POLL_S)


def drained(reports: list[Report], flag_at: float) -> bool:
    """Every live ingress replica (one that reported within ``LIVE_S`` of the flag) has
    seen the flag and holds nothing."""
    live = [r for r in reports if r.at >= flag_at - LIVE_S]
    return all(r.draining and r.in_flight == 0 for r in live)


def ray_kv() -> tuple[Callable[[bytes], bytes | None], Callable[[bytes, bytes], Any]]:
    from ray.experimental import internal_kv as kv

    return (
        lambda k: kv._internal_kv_get(k, namespace=NAMESPACE),
        lambda k, v: kv._internal_kv_put(k, v, overwrite=True, namespace=NAMESPACE),
    )


def drain_app(app: str, timeout_s: float = 60.0) -> bool:
    """Raise ``app``'s flag and wait until its ingress replicas hold nothing (True), or
    ``timeout_s`` passes (False). Needs a connected Ray."""
    from ray.experimental import internal_kv as kv

    t0 = time.time()
    kv._internal_kv_put(flag_key(app), f"{t0:.3f}".encode(), overwrite=True, namespace=NAMESPACE)
    while time.time() - t0 < timeout_s:
        time.sleep(POLL_S)
        keys = kv._internal_kv_list(report_prefix(app), namespace=NAMESPACE)
        reports = []
        for k in keys:
            raw = kv._internal_kv_get(k, namespace=NAMESPACE)
            if raw is not None:
                reports.append(Report.decode(raw))
        if reports and drained(reports, t0) and time.time() - t0 > 2 * POLL_S:
            return True
        if not reports and time.time() - t0 > LIVE_S:
            return True  # no ingress replica of this app reports (an app of another kind)
    return False


def forget(app: str) -> None:
    """Drop ``app``'s flag and reports (after it is deleted)."""
    from ray.experimental import internal_kv as kv

    kv._internal_kv_del(flag_key(app), namespace=NAMESPACE)
    kv._internal_kv_del(report_prefix(app), del_by_prefix=True, namespace=NAMESPACE)
