"""The lanes of the GPU preprocess stage's local rounds (``preprocess.decode_rounds``): each
a decoder, a stream and the fitter that enqueues on it, so that as many rounds as there are
lanes run at once, one on each thread of the stage's GPU pool -- the next round's images
start while one round waits inside its decoder call. A round takes a free lane for its
whole length and gives it back; the pinned ring, the pool and the completion watcher are
the stage's, shared (each is safe to use from several threads). Each lane has its own
completion watcher (the first lane's is the stage's): a watcher finishes events in the order
it gets them, so with one shared a round would be seen done no sooner than the other lane's
round handed to it before."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

from ..async_result import CompletionWatcher
from ..device import Event, Stream
from .fitter import GpuFitter


class Lane:
    """One round's tools: ``decoder`` (None: nvImageCodec does not decode here), ``stream``
    (its decodes and fits), ``fitter`` (its fits, on ``stream``) and ``watcher`` (its
    device events: the fits' releases and the round's end)."""

    __slots__ = ("decoder", "stream", "fitter", "watcher")

    def __init__(
        self, decoder: Any, stream: Stream, fitter: GpuFitter, watcher: CompletionWatcher
    ) -> None:
        self.decoder = decoder
        self.stream = stream
        self.fitter = fitter
        self.watcher = watcher


class Done(NamedTuple):
    """A round's end on the device, and the watcher of its lane that sees it."""

    event: Event
    watcher: CompletionWatcher


class Lanes:
    """The lanes, each held by one round at a time."""

    def __init__(self, lanes: list[Lane]) -> None:
        if not lanes:
            raise ValueError("a stage needs at least one lane")
        self.all = list(lanes)
        self._free: queue.SimpleQueue[Lane] = queue.SimpleQueue()
        for lane in self.all:
            self._free.put(lane)

    @contextmanager
    def take(self) -> Iterator[Lane]:
        """A free lane for the round (the scheduler runs no more rounds than there are
        lanes, so one is free), given back when the round's host work is done."""
        lane = self._free.get()
        try:
            yield lane
        finally:
            self._free.put(lane)
