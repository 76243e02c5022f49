"""The lanes of the GPU preprocess stage's local rounds (``preprocess.decode_rounds``): each
a decoder, a stream and the fitter that enqueues on it, so that as many rounds as there are
lanes run at once, one on each thread of the stage's GPU pool -- the next round's images
start while one round waits inside its decoder call. A round takes a free lane for its
whole length and gives it back; the pinned ring, the pool and the completion watcher are
the stage's, shared (each is safe to use from several threads). The watcher finishes events
in the order it was given them, so a lane's round is seen done no sooner than the rounds
handed to it before (on their own streams they may end later): a cost of the experiment."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..device import Stream
from .fitter import GpuFitter


class Lane:
    """One round's tools: ``decoder`` (None: nvImageCodec does not decode here), ``stream``
    (its decodes and fits) and ``fitter`` (its fits, on ``stream``)."""

    __slots__ = ("decoder", "stream", "fitter")

    def __init__(self, decoder: Any, stream: Stream, fitter: GpuFitter) -> None:
        self.decoder = decoder
        self.stream = stream
        self.fitter = fitter


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
