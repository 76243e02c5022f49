"""AsyncResult: a value that arrives later from another thread, completed from a CUDA event.

``CompletionWatcher`` is one thread that blocks on each watched event in turn
(``cudaEventSynchronize`` releases the GIL), runs the finishing step and completes the
result (the GPU preprocessing stage's batches). The executor's batches complete through
``executor_completion.Completions`` instead, where a waiting thread blocks on its batch's
event itself and is woken once. ``complete`` is the finishing step both share. No request
polls.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .device import Event
from .errors import DeviceError, FerryError
from .handoff import inbox_of, post_result
from .threads import QueueThreads

logger = logging.getLogger(__name__)
T = TypeVar("T")
_PENDING = object()


class AsyncResult(Generic[T]):
    """A value that arrives later, from another thread. Thread-safe and awaitable."""

    __slots__ = ("_lock", "_cond", "_value", "_exc", "_callbacks", "label")

    def __init__(self, label: str = "") -> None:
        self._lock = threading.Lock()
        # made by the first thread that must block (most results are complete before anyone
        # waits, or are completed by the thread that waits: a condition a result is ~2 us)
        self._cond: threading.Condition | None = None
        self._value: Any = _PENDING
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[AsyncResult[T]], Any]] = []
        self.label = label

    # -- constructors for results known at once
    @classmethod
    def completed(cls, value: T, label: str = "") -> AsyncResult[T]:
        r: AsyncResult[T] = cls(label)
        r.set_result(value)
        return r

    @classmethod
    def failed(cls, exc: BaseException, label: str = "") -> AsyncResult[T]:
        r: AsyncResult[T] = cls(label)
        r.set_exception(exc)
        return r

    # -- producer side
    def set_result(self, value: T) -> bool:
        return self._finish(value, None)

    def set_exception(self, exc: BaseException) -> bool:
        return self._finish(None, exc)

    def _finish(self, value: Any, exc: BaseException | None) -> bool:
        with self._lock:
            if self.done():
                return False
            if exc is not None:
                self._exc = exc
                self._value = None
            else:
                self._value = value
            callbacks, self._callbacks = self._callbacks, []
            if self._cond is not None:
                self._cond.notify_all()
        for cb in callbacks:
            self._run_callback(cb)
        return True

    def _run_callback(self, cb: Callable[[AsyncResult[T]], Any]) -> None:
        try:
            cb(self)
        except Exception:
            logger.exception("done-callback of %s raised", self.label or "an AsyncResult")

    # -- consumer side
    def done(self) -> bool:
        return self._value is not _PENDING or self._exc is not None

    def wait_for(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds; True when the result is complete."""
        if self.done():  # (set before the waiters are told: no lock needed to see it)
            return True
        with self._lock:
            if self.done():
                return True
            cond = self._cond
            if cond is None:  # (under the lock, which the condition shares: made once)
                cond = self._cond = threading.Condition(self._lock)
            return cond.wait_for(self.done, timeout=timeout)

    def wait(self, timeout: float | None = None) -> T:
        """The value, or the commit's exception re-raised; ``TimeoutError`` after ``timeout``."""
        if not self.wait_for(timeout):
            raise TimeoutError(f"{self.label or 'result'} not complete after {timeout} s")
        return self.result()

    def result(self) -> T:
        if not self.done():
            raise RuntimeError("result is not complete yet")
        if self._exc is not None:
            raise self._exc
        return self._value

    def exception(self) -> BaseException | None:
        if not self.done():
            raise RuntimeError("result is not complete yet")
        return self._exc

    def add_done_callback(self, cb: Callable[[AsyncResult[T]], Any]) -> None:
        """Run ``cb(self)`` when complete -- at once, in this thread, if it already is."""
        with self._lock:
            if not self.done():
                self._callbacks.append(cb)
                return
        self._run_callback(cb)

    def __await__(self):
        if self.done():
            return self.result()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        inbox = inbox_of(loop)  # (the loop woken once for all results completed together)

        def transfer(r: AsyncResult[T]) -> None:
            exc = r._exc
            post_result(inbox, fut, exc is None, r._value if exc is None else exc)

        self.add_done_callback(transfer)
        return (yield from fut.__await__())

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._exc else "done")
        return f"AsyncResult({self.label!r}, {state})"


class CompletionWatcher(QueueThreads):
    """One thread that turns device events into completed ``AsyncResult``s, in order."""

    def __init__(self, name: str = "ferry-completion") -> None:
        super().__init__([name], complete)

    def watch(
        self,
        event: Event,
        finish: Callable[[], T],
        result: AsyncResult[T],
        on_error: Callable[[BaseException], Any] | None = None,
    ) -> None:
        """When ``event`` completes, ``result`` gets ``finish()`` (or its exception).

        An event that is already complete (the CPU backend's) is finished inline: the
        CPU backend then needs no thread at all. After ``close`` it raises
        ``RuntimeError``.
        """
        if event.raw is None:
            complete(event, finish, result, on_error)
            return
        self.put((event, finish, result, on_error))

    def close(self, timeout: float = 10.0) -> None:
        super().close(timeout)


def complete(
    event: Event,
    finish: Callable[[], Any],
    result: AsyncResult,
    on_error: Callable[[BaseException], Any] | None,
) -> None:
    """Wait on ``event`` in this thread, then complete ``result`` with ``finish()``; a
    failure of either (a CUDA error, the finishing step) is handed to ``on_error`` and
    becomes the result's exception (``DeviceError`` unless it is Ferry's own)."""
    try:
        event.synchronize()
        value = finish()
    except BaseException as exc:  # a CUDA error surfaces here, or the finishing step failed
        err = device_error(exc)
        if on_error is not None:
            try:
                on_error(err)
            except Exception:
                logger.exception("error handler of %s raised", result.label)
        result.set_exception(err)
        return
    result.set_result(value)


def device_error(exc: BaseException) -> FerryError:
    """``exc`` as the error a device wait or its finishing step fails with: Ferry's own as
    it is, any other (a CUDA error) as a ``DeviceError`` naming it."""
    return exc if isinstance(exc, FerryError) else DeviceError(f"{type(exc).__name__}: {exc}")
