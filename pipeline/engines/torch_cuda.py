"""What the ``torch`` engine holds on the GPU, counted in Ferry's pool (``TorchCharge``), and
its captured CUDA graphs launched on the executor's streams (``TorchGraph``). CUDA only."""

from __future__ import annotations

import threading
from typing import Any

from ..errors import ResourceExhausted
from .torch_sources import _torch


class TorchCharge:
    """Ferry's pool counts what torch holds on the device: one accounted reservation per
    pool, kept equal to ``torch.cuda.memory_reserved`` (weights, graph pools, cache)."""

    _lock = threading.Lock()
    _held: dict[int, Any] = {}

    @classmethod
    def sync(cls, pool: Any, device: int, what: str) -> int:
        """Account what torch reserves now; where the pool has no room for it, first give
        torch's cache of freed blocks back to the driver (a device sync: the warm-up's
        eager runs and compiles leave gigabytes cached that no graph needs) and try once
        more."""
        try:
            return cls._sync(pool, device, what)
        except ResourceExhausted:
            torch = _torch()
            torch.cuda.synchronize(device)
            torch.cuda.empty_cache()
            return cls._sync(pool, device, what)

    @classmethod
    def _sync(cls, pool: Any, device: int, what: str) -> int:
        torch = _torch()
        want = int(torch.cuda.memory_reserved(device))
        with cls._lock:
            old = cls._held.get(id(pool))
            if old is not None and old.nbytes >= want:
                return want
            if old is not None:
                old.release()
                cls._held.pop(id(pool))
            try:
                cls._held[id(pool)] = pool.account(want)
            except ResourceExhausted as exc:
                exc.fields.update(torch_reserved_bytes=want, when=what)
                raise
        return want

    @classmethod
    def release(cls, pool: Any) -> None:
        with cls._lock:
            held = cls._held.pop(id(pool), None)
        if held is not None:
            held.release()


class TorchGraph:
    """A torch CUDA graph that the executor launches on its raw (cupy) stream.

    The launch is ``cudaGraphLaunch`` of torch's instantiated graph on that stream, straight
    through cupy (a few microseconds), where torch has ``raw_cuda_graph_exec``; else
    ``replay`` under ``torch.cuda.stream``, which costs tens of microseconds of Python per
    batch -- at batch 1 the executor's host time is the limit. The direct launch skips
    torch's per-replay bump of the random-number offsets: an inference graph draws none."""

    def __init__(self, graph: Any, device: Any) -> None:
        self.graph, self.device = graph, device
        self._ext: tuple[int, Any] | None = None  # (raw pointer, its torch ExternalStream)
        raw = getattr(graph, "raw_cuda_graph_exec", None)
        self._exec = int(raw()) if raw is not None else 0
        if self._exec:
            from cupy.cuda import runtime  # cupy: the GPU backend, present where graphs are

            self._graph_launch = runtime.graphLaunch

    def launch(self, raw_stream: Any) -> None:
        if self._exec:
            self._graph_launch(self._exec, raw_stream.ptr)  # one cudaGraphLaunch
            return
        torch = _torch()
        ext = self._ext
        if ext is None or ext[0] != raw_stream.ptr:  # the executor pins an arena's stream
            ext = torch.cuda.ExternalStream(raw_stream.ptr, device=self.device)
            self._ext = ext = (raw_stream.ptr, ext)
        with torch.cuda.stream(ext[1]):
            self.graph.replay()
