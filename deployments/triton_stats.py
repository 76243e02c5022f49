"""One statistics book for all ingress replicas (the statistics extension).

Each ingress replica counts its own requests (its ``triton.Stats`` book, ``Ingress.book``). perf_analyzer takes the
server's queue and compute times as differences of two ``/v2/models/{m}/stats`` snapshots,
in unsigned 64-bit integers; with several ingress replicas the two GETs land on any two of
them, and a snapshot of a replica that had counted fewer nanoseconds than the one before
made the difference negative: it wrapped to ~1.8e19 ns (digits at concurrency 16 on the
H200 read a queue of 9.4e9 ms a request). So every replica publishes a copy of its book
to ``StatsBoard`` (a named actor, one per Serve app) within ``2 * publish_every_s`` (0.1 s)
of a change, and again before it answers a stats GET, which answers the sum over
replicas: never smaller than an earlier one. (Another replica's last 0.1 s may be missing
from it; a dead replica's last book stays in the sum.)
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import ray
from ray import serve

from pipeline.protocol import triton

NAME = "ferry_triton_stats"


@ray.remote(num_cpus=0)
class StatsBoard:
    """The last book each replica published, summed on request."""

    def __init__(self) -> None:
        self._by_replica: dict[str, Any] = {}

    def put(self, replica: str, books: dict[str, Any]) -> None:
        self._by_replica[replica] = books  # cumulative: the newest replaces the older

    def total(self, replica: str, books: dict[str, Any]) -> dict[str, Any]:
        self._by_replica[replica] = books
        return triton.merge(list(self._by_replica.values()))


class SharedStats:
    """The ingress's side: publishes this process's book, reads the sum."""

    def __init__(self, app: str, book: triton.Stats) -> None:
        self.book = book
        self.replica = f"{os.getpid()}-{id(self)}"
        self.board = StatsBoard.options(
            name=f"{NAME}:{app}", namespace="ferry", get_if_exists=True, lifetime="detached"
        ).remote()
        self._flush: asyncio.Task | None = None
        book.publish = self._changed

    def _put(self) -> None:
        self.board.put.remote(self.replica, self.book.books())  # (answered in order)

    def _changed(self) -> None:
        """The book changed: publish it soon (once, whatever changes meanwhile)."""
        if self._flush is not None and not self._flush.done():
            return
        try:
            self._flush = asyncio.get_running_loop().create_task(self._later())
        except RuntimeError:  # no event loop in this thread: at once
            self._put()

    async def _later(self) -> None:
        await asyncio.sleep(self.book.publish_every_s)
        self._put()

    async def model_stats(self, models: list[str]) -> dict[str, Any]:
        total = await self.board.total.remote(self.replica, self.book.books())
        return self.book.model_stats(models, total)


class LocalStats:
    """Outside a Serve replica (a class built by hand): this replica's book alone."""

    def __init__(self, book: triton.Stats) -> None:
        self.book = book

    async def model_stats(self, models: list[str]) -> dict[str, Any]:
        return self.book.model_stats(models)


def for_this_replica(book: triton.Stats) -> SharedStats | LocalStats:
    """The shared book of this replica's Serve app, ``book`` its part; outside Serve, the
    book alone."""
    try:
        app = serve.get_replica_context().app_name
    except Exception:  # (RayServeException: not in a replica)
        return LocalStats(book)
    return SharedStats(app, book)
