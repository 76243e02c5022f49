"""The records of ``pipeline.metrics`` between the caller and Ray: ``Buffer`` (what waits to
be exported, handed to Ray's metric objects by a thread of its own every ``FLUSH_S``) and
``Histograms`` (observations kept in the process as Prometheus histograms: running counts by
bucket and an exact sum, exported as gauges). ``pipeline.metrics`` says why both exist; this
module holds no Ray object of its own -- the sinks are handed in."""

from __future__ import annotations

import bisect
import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .threads import name_os_thread

logger = logging.getLogger("pipeline.metrics")

LATENCY_BOUNDARIES_MS = [0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
BATCH_BOUNDARIES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]

HISTOGRAMS = {"stage": LATENCY_BOUNDARIES_MS, "batch": BATCH_BOUNDARIES}
"""The histograms kept in the replica (``Histograms``), by record name, and their bounds."""
FLUSH_S = 0.5
MAX_PENDING = 100_000
REFRESH_S = 5.0
"""How often every gauge is set again, changed or not (``Buffer``): at Ray's default report
interval (10 s) its metrics agent drops a gauge not set within 20 s."""


class Histograms:
    """Observations counted per (record name, label set) by bucket, with their exact sum,
    from any thread, as running totals since the process started; ``drain`` sets the label
    sets observed since the last drain on Ray's gauges: cumulative buckets, count and sum,
    as Prometheus' histogram has them (``rate`` and ``histogram_quantile`` read them; a
    replica's restart is a counter reset to them)."""

    def __init__(self, bounds: dict[str, list[float]] = HISTOGRAMS) -> None:
        self.bounds = bounds
        self._les = {n: [*(repr(float(b)) for b in bs), "+Inf"] for n, bs in bounds.items()}
        self._cells: dict[tuple, list[float]] = {}
        self._dirty: set[tuple] = set()
        self._lock = threading.Lock()

    def observe(self, name: str, value: float, tags: tuple = (), n: int = 1) -> None:
        i = bisect.bisect_left(self.bounds[name], value)  # the first bucket whose le holds it
        with self._lock:
            cell = self._cell(name, tags)
            cell[i] += n
            cell[-1] += value * n

    def observe_each(self, name: str, values: list[float], tags: tuple = ()) -> None:
        """One observation of each value (a batch's items, each its own): one lock."""
        bounds = self.bounds[name]
        slots = [bisect.bisect_left(bounds, v) for v in values]
        with self._lock:
            cell = self._cell(name, tags)
            for i in slots:
                cell[i] += 1
            cell[-1] += sum(values)

    def _cell(self, name: str, tags: tuple) -> list[float]:
        """The running counts of (``name``, ``tags``): a count a bucket, then the sum; marked
        to drain. Called under the lock."""
        key = (name, tags)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = [0] * (len(self.bounds[name]) + 1) + [0.0]
        self._dirty.add(key)
        return cell

    def drain(self, sinks: dict[str, Any], every: bool = False) -> int:
        """Export the label sets observed since the last drain (``every``: all of them); the
        number of Ray calls."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            cells = {k: list(self._cells[k]) for k in (self._cells if every else dirty)}
        calls = 0
        for (name, tags), cell in cells.items():
            base = dict(tags)
            les = self._les[name]
            below = 0
            for le, count in zip(les, cell[:-1], strict=True):
                below += count
                sinks[f"{name}_bucket"].set(below, tags={**base, "le": le})
            sinks[f"{name}_count"].set(below, tags=base or None)
            sinks[f"{name}_sum"].set(cell[-1], tags=base or None)
            calls += len(les) + 2
        return calls


class Buffer:
    """Records waiting for Ray: appended from any thread (a deque append holds the GIL
    throughout), handed to ``sinks`` (name -> Ray metric object) by ``flush``.

    Every ``refresh_s`` a flush sets every gauge again -- each one's last value and every
    histogram's cells -- whether or not it changed: a Ray worker exports a gauge at the
    report interval after it is set, once, and Ray's metrics agent drops one not exported
    again within two intervals (``open_telemetry_metric_recorder``'s TTL; measured on Ray
    2.60: a gauge set once was gone from the node's endpoint 20-30 s later). Without it an
    idle replica's queue depth, pool bytes, executor counts and histograms left Prometheus
    while the replica still served (a gap, then counter resets for ``rate``). ``clock``: the
    seconds ``refresh_s`` is counted in (tests pass their own)."""

    def __init__(
        self,
        sinks: dict[str, Any],
        max_pending: int = MAX_PENDING,
        refresh_s: float = REFRESH_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.sinks = sinks
        self.max_pending = max_pending
        self.refresh_s = refresh_s
        self.clock = clock
        self._gauges: dict[tuple, float] = {}  # every gauge's last value, by (name, tags)
        self._refreshed = clock()
        self.pending: collections.deque = collections.deque()
        self.histograms = Histograms()
        self.dropped = 0
        self._flush_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def put(self, name: str, op: str, value: float, tags: tuple = ()) -> None:
        if op == "observe":
            self.histograms.observe(name, value, tags)
            return
        if len(self.pending) >= self.max_pending:
            self.dropped += 1
            return
        self.pending.append((name, op, value, tags))

    def observe(self, name: str, value: float, tags: tuple = (), n: int = 1) -> None:
        """``n`` observations of ``value`` (a batch's items, each the batch's time)."""
        self.histograms.observe(name, value, tags, n)

    def observe_each(self, name: str, values: list[float], tags: tuple = ()) -> None:
        self.histograms.observe_each(name, values, tags)

    def flush(self) -> int:
        """Hand every waiting record to its metric; the number of Ray calls made."""
        with self._flush_lock:
            n = len(self.pending)
            last: dict[tuple, float] = {}  # gauges: the last value per (name, tags)
            sums: dict[tuple, float] = {}  # counters: the sum per (name, tags)
            for _ in range(n):
                name, op, value, tags = self.pending.popleft()
                if op == "set":
                    last[(name, tags)] = value
                else:
                    sums[(name, tags)] = sums.get((name, tags), 0.0) + value
            dropped, self.dropped = self.dropped, 0
            if dropped:
                sums[("dropped", ())] = sums.get(("dropped", ()), 0.0) + dropped
                logger.warning("%d metric records dropped: the exporter fell behind", dropped)
            self._gauges.update(last)
            now = self.clock()
            every = now - self._refreshed >= self.refresh_s
            if every:
                self._refreshed = now
                last = dict(self._gauges)
            calls = self.histograms.drain(self.sinks, every)
            for (name, tags), value in last.items():
                self.sinks[name].set(value, tags=dict(tags) if tags else None)
                calls += 1
            for (name, tags), value in sums.items():
                self.sinks[name].inc(value, tags=dict(tags) if tags else None)
                calls += 1
            return calls

    def start(self, every_s: float = FLUSH_S) -> None:
        """The flushing thread, once (a daemon: it ends with the process)."""
        if self._thread is not None:
            return

        def run() -> None:
            name_os_thread()
            while True:
                time.sleep(every_s)
                try:
                    self.flush()
                except Exception:  # a metric must never take the replica down
                    logger.exception("metrics flush failed")

        self._thread = threading.Thread(target=run, name="ferry-metrics", daemon=True)
        self._thread.start()
