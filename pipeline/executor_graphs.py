"""Bound graphs and CUDA graphs per bucket, and the warm-up that makes them.

A plan bound to one reserved arena on one compute stream is kept (least recently used
dropped past ``MAX_BOUND``); ``prepare`` looks it up, so a batch knows its graph before
its commit. On the GPU in ``real`` mode its first eager run is recorded as a CUDA graph,
replayed by every later batch that gets the same arena on the same stream. ``warmup``
runs every bucket -- twice on the GPU, with one arena per in-flight batch -- so those
graphs exist before the first request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from .device import Stream
from .engines.base import BoundModel, Engine
from .executor_batch import PreparedBatch
from .executor_models import ModelTable

logger = logging.getLogger("pipeline.executor")
MAX_BOUND = 256  # bound graphs (and their CUDA graphs) kept, least recently used dropped


class BoundGraphs:
    """The LRU cache of (bound plan, CUDA graph or None), keyed by model, bucket, feed,
    arena pointer and compute stream; ``count`` is told of each capture. Thread-safe: a
    key belongs to the one batch that holds its arena, so only the cache is locked."""

    def __init__(self, count: Callable[..., None]) -> None:
        self._bound: OrderedDict[tuple, tuple[BoundModel, Any]] = OrderedDict()
        self._count = count
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._bound)

    def forget(self, model: str) -> None:
        """Drop every entry of ``model`` (a model unloaded)."""
        with self._lock:
            for key in [k for k in self._bound if k[0] == model]:
                del self._bound[key]

    def items(self) -> list[tuple[tuple, tuple[BoundModel, Any]]]:
        """(key, (bound plan, CUDA graph or None)) of every entry, oldest first: which arenas
        and streams have graphs (tests and diagnostics read it)."""
        with self._lock:
            return list(self._bound.items())

    @staticmethod
    def key(p: PreparedBatch, compute: Stream) -> tuple:
        assert p.reservation is not None
        return (p.model, p.bucket, p.plan.feed, p.reservation.ptr, compute.name)

    def get(
        self, p: PreparedBatch, compute: Stream, engine: Engine, key: tuple | None = None
    ) -> tuple[BoundModel, Any]:
        """The plan bound to the batch's arena (bound now on a miss) and its CUDA graph;
        ``key`` is ``key(p, compute)`` where the caller has it."""
        assert p.reservation is not None
        key = key or self.key(p, compute)
        with self._lock:
            hit = self._bound.get(key)
            if hit is not None:
                self._bound.move_to_end(key)
                return hit
        bound = engine.bind(p.plan, p.reservation.buffer)  # views only: no device work
        with self._lock:
            self._bound[key] = (bound, None)
            while len(self._bound) > MAX_BOUND:
                self._bound.popitem(last=False)
        return bound, None

    def capture(self, p: PreparedBatch, compute: Stream, bound: BoundModel) -> None:
        """Record the bound graph as a CUDA graph for the next batch that gets this arena."""
        key = self.key(p, compute)
        try:
            graph = bound.capture(compute)
        except Exception:
            logger.exception(
                "CUDA graph capture failed for %s bucket %d; staying eager", p.model, p.bucket
            )
            return
        with self._lock:
            self._bound[key] = (bound, graph)
        self._count(captures=1)

    def clear(self) -> None:
        with self._lock:
            self._bound.clear()


def warmup(
    models: ModelTable,
    prepare: Callable[..., PreparedBatch],
    commit: Callable[[PreparedBatch, np.ndarray], Any],
    names: list[str],
    depth: int,
    rounds: int,
    runs_all: bool = True,
) -> dict[str, float]:
    """Plan every bucket of ``names`` and run it ``rounds`` times with ``depth`` batches in
    flight (on the GPU: twice, one arena per in-flight batch, so each arena's CUDA graph is
    captured and then replayed once). Small buckets first, so the pool's blocks for each
    bucket are exact fits that later batches get back. Without ``runs_all`` (the CPU: no
    graph to capture) only the smallest bucket runs; the others are prepared -- planned,
    their arena reserved -- and released."""
    times: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        buckets = models.buckets_of(name)
        engine = models.get(name).engine
        with engine.warm_gate(tuple(buckets)):  # a compiling engine: one compile a machine
            for feed in engine.feeds:
                item = models.plan(name, 1, feed).input_spec
                for k, bucket in enumerate(buckets):
                    if k and not runs_all:
                        prepare(name, bucket, feed=feed).release()
                        continue
                    for _round in range(rounds):
                        prepared = [prepare(name, bucket, feed=feed) for _ in range(depth)]
                        zeros = np.zeros((bucket, *item.shape[1:]), dtype=item.np_dtype)
                        for r in [commit(p, zeros) for p in prepared]:
                            r.wait()
        times[name] = time.perf_counter() - t0
        logger.info("warmed up %s: %d buckets in %.2f s", name, len(buckets), times[name])
    return times
