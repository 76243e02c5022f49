"""The executor's book: its counts, when a batch last ended (health reads it) and the
device error that poisoned it, once a batch has had one. Every part that finishes or
fails a batch is handed this one object."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import DeviceError, FerryError
from .health import as_ferry_error

logger = logging.getLogger("pipeline.executor")

COUNTS = (
    "batches",
    "items",
    "padded_items",
    "graph_replays",
    "eager_runs",
    "captures",
    "failed",
    "in_flight",
    "max_in_flight_seen",
)


def _high_water(n: dict[str, int]) -> None:
    """``max_in_flight_seen`` raised to ``in_flight`` (under the counters' lock)."""
    if n["in_flight"] > n["max_in_flight_seen"]:
        n["max_in_flight_seen"] = n["in_flight"]


class Counters:
    """Counts under one lock; ``last_progress`` and ``device_error`` beside them.
    ``clock``: what ``last_progress`` reads (the replica's health compares it with its own
    clock: tests pass one fake clock to both)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._n = dict.fromkeys(COUNTS, 0)
        self.clock = clock
        self.last_progress = clock()  # when a batch last finished (health)
        self.device_error: DeviceError | None = None

    def count(self, **deltas: int) -> None:
        with self._lock:
            n = self._n
            for k, v in deltas.items():
                n[k] += v
            _high_water(n)

    def committed(self, items: int, padded: int, replay: bool) -> None:
        """A batch enqueued: ``count`` of its figures, without keywords (once a batch)."""
        with self._lock:
            n = self._n
            n["batches"] += 1
            n["items"] += items
            n["padded_items"] += padded
            n["graph_replays" if replay else "eager_runs"] += 1
            n["in_flight"] += 1
            _high_water(n)

    def finished(self) -> None:
        """A batch ended well: progress now, one fewer in flight."""
        self.last_progress = self.clock()
        with self._lock:
            self._n["in_flight"] -= 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._n)

    @property
    def in_flight(self) -> int:
        return self._n["in_flight"]

    def failure(self, exc: BaseException) -> FerryError:
        """A batch's failure as Ferry's error; a device error poisons the executor."""
        err = as_ferry_error(exc)
        self.last_progress = self.clock()
        if isinstance(err, DeviceError) and self.device_error is None:
            logger.error("device error, the executor is poisoned: %s", err)
            self.device_error = err
        return err
