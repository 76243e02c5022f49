"""Whether a replica that owns an executor can serve: the truth its ``check_health`` and
readiness tell.

A replica is *warming* until its warm-up ends (not ready), then *ready*, and *draining*
once it stops for good: its device is poisoned (a ``DeviceError`` from a batch or from
the device probe), its scheduler is wedged (work queued or in flight and no batch
finished for ``health.stall_after_s``), or someone called ``drain``. A draining replica
refuses new work at once (503 ``Unavailable``, safe to retry on another replica), lets what
is in flight finish, answers not-ready, and fails ``check_health`` so that Serve replaces it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .config.health import HealthConfig
from .errors import DeviceError, FerryError, ResourceExhausted, Unavailable

logger = logging.getLogger(__name__)


def as_ferry_error(exc: BaseException) -> FerryError:
    """A failure while enqueueing or running a batch, as Ferry's error: out of memory
    (``MemoryError``, cupy's ``OutOfMemoryError``, ``cudaErrorMemoryAllocation``) is
    ``ResourceExhausted`` (503, retry: it fails only that batch); anything else from the
    device is ``DeviceError``."""
    if isinstance(exc, FerryError):
        return exc
    text = f"{type(exc).__name__}: {exc}"
    if (
        isinstance(exc, MemoryError)
        or "OutOfMemory" in type(exc).__name__
        or "cudaErrorMemoryAllocation" in text
    ):
        return ResourceExhausted("out of device memory for this batch", detail=text[:200])
    return DeviceError(text)


def probe(backend: Any) -> None:
    """Raise ``DeviceError`` when the device no longer answers (a sticky CUDA error makes
    every runtime call fail; asking for memory info waits on nothing)."""
    if not backend.is_cuda:
        return
    try:
        from cupy.cuda import runtime  # optional: cupy

        backend.activate()
        runtime.memGetInfo()
    except Exception as exc:
        raise DeviceError(f"device probe failed: {type(exc).__name__}: {exc}") from None


class ReplicaHealth:
    """The state of one replica's executor and scheduler. ``pending`` counts the rows
    queued for the GPU; the executor gives its in-flight count, the time its last batch
    ended and, once it has had one, the device error that poisoned it."""

    def __init__(
        self,
        config: HealthConfig,
        executor: Any,
        pending: Callable[[], int] = lambda: 0,
        warm: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.executor = executor
        self.pending = pending
        self.clock = clock
        self.state = "ready" if warm else "warming"  # warm: built after its warm-up
        self.reason = ""
        self._idle_at = clock()
        self._lock = threading.Lock()

    def set_ready(self) -> None:
        with self._lock:
            if self.state == "warming":
                self.state = "ready"

    def drain(self, reason: str) -> None:
        """Stop for good: refuse new work, finish what is in flight, fail health checks."""
        with self._lock:
            if self.state == "draining":
                return
            self.state, self.reason = "draining", reason
        logger.error("replica draining: %s", reason)

    def _fault(self) -> str | None:
        """Why the replica cannot serve, or None."""
        err = self.executor.device_error
        if err is None and self.config.probe_device:
            try:
                self.executor.probe()
            except DeviceError as exc:
                err = exc
        if err is not None:
            return f"device error: {err}"
        now = self.clock()
        queued = self.pending()
        in_flight = self.executor.in_flight
        if queued == 0 and in_flight == 0:
            self._idle_at = now
            return None
        since = max(self._idle_at, self.executor.last_progress)
        if now - since > self.config.stall_after_s:
            return (
                f"wedged: {queued} rows queued and {in_flight} batches in flight, "
                f"no batch finished for {now - since:.1f} s"
            )
        return None

    def check(self) -> None:
        """Raise (``check_health``) when the replica cannot serve; a fault found here
        starts the drain."""
        if self.state == "ready":
            fault = self._fault()
            if fault is not None:
                self.drain(fault)
        if self.state == "draining":
            raise Unavailable("replica is draining", reason=self.reason)

    @property
    def ready(self) -> bool:
        """Warm, and neither poisoned, wedged nor draining (readiness)."""
        if self.state != "ready":
            return False
        try:
            self.check()
        except FerryError:
            return False
        return True

    def admit(self) -> None:
        """Refuse new work at once while draining (the client retries elsewhere)."""
        if self.state == "ready" and self.executor.device_error is not None:
            self.drain(f"device error: {self.executor.device_error}")
        if self.state == "draining":
            raise Unavailable(
                "replica is draining; retry",
                reason=self.reason,
                retry_after_s=self.config.retry_after_s,
            )

    def snapshot(self) -> dict[str, Any]:
        return {"state": self.state, "reason": self.reason, "ready": self.ready}
