"""Backend choice and the device's fixed streams and events.

``cupy`` on a CUDA device, ``numpy`` otherwise. The CPU backend has the same surface:
its streams run work inline, its events are complete the moment they are recorded. Code
above this module never branches on "is there a GPU" except through ``Backend.is_cuda``
and ``Stream.is_cuda``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .cuda_wait import set_host_wait
from .errors import DeviceError

if TYPE_CHECKING:  # pragma: no cover
    import cupy  # optional: cupy

logger = logging.getLogger(__name__)

BackendName = Literal["auto", "cupy", "numpy"]
CUBLAS_WORKSPACE_BYTES = 32 << 20
StreamPriority = Literal["normal", "high"]
HIGH_PRIORITY = -1000
"""What a ``high`` stream asks CUDA for: past the device's greatest priority (-5 on Hopper),
which CUDA clamps it to, so no range query is needed."""


@functools.lru_cache(maxsize=1)
def cuda_device_count() -> int:
    """How many CUDA devices cupy sees; 0 when cupy is missing or finds no driver."""
    try:
        import cupy  # noqa: F401
        from cupy.cuda import runtime  # optional: cupy

        return int(runtime.getDeviceCount())
    except Exception as exc:  # ImportError, CUDARuntimeError (no driver), ...
        logger.debug("no CUDA device: %s", exc)
        return 0


def cuda_available() -> bool:
    return cuda_device_count() > 0


def is_device_array(a: Any) -> bool:
    """A cupy array (checked by type, so it works where cupy is not installed)."""
    return type(a).__module__.startswith("cupy")


@dataclass(frozen=True)
class Backend:
    """The array library and device a component computes with."""

    name: Literal["cupy", "numpy"]
    device_id: int = 0
    host_wait: str = field(default="auto", compare=False)
    """How host threads wait for this device (``executor.host_wait``; ``pipeline.cuda_wait``),
    set on its primary context before this process first activates it."""

    @property
    def is_cuda(self) -> bool:
        return self.name == "cupy"

    @property
    def xp(self) -> Any:
        if self.is_cuda:
            import cupy  # optional: cupy

            return cupy
        return np

    @property
    def compute_dtype(self) -> np.dtype:
        """fp16 on the GPU, fp32 on the CPU (numpy's fp16 GEMM is emulated and slow)."""
        return np.dtype(np.float16 if self.is_cuda else np.float32)

    def activate(self) -> None:
        """Make this backend's device current for the calling thread."""
        if self.is_cuda:
            import cupy  # optional: cupy

            set_host_wait(self.host_wait, self.device_id)  # once: before the context starts
            cupy.cuda.Device(self.device_id).use()

    def total_memory(self) -> int:
        if self.is_cuda:
            import cupy  # optional: cupy

            with cupy.cuda.Device(self.device_id):
                _free, total = cupy.cuda.runtime.memGetInfo()
            return int(total)
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            return 8 << 30

    def describe(self) -> str:
        if not self.is_cuda:
            return "numpy (CPU)"
        import cupy  # optional: cupy

        props = cupy.cuda.runtime.getDeviceProperties(self.device_id)
        name = props["name"]
        return f"cupy on {name.decode() if isinstance(name, bytes) else name} (device {self.device_id})"


def select_backend(
    kind: BackendName = "auto", device_id: int = 0, host_wait: str = "auto"
) -> Backend:
    """``auto`` takes cupy when a CUDA device is visible, numpy otherwise."""
    if kind == "numpy":
        return Backend("numpy", device_id)
    if kind == "cupy":
        if not cuda_available():
            raise DeviceError(
                "backend 'cupy' asked for, but no CUDA device is visible", device_id=device_id
            )
        return Backend("cupy", device_id, host_wait)
    if kind != "auto":
        raise ValueError(f"backend must be 'auto', 'cupy' or 'numpy', not {kind!r}")
    return Backend("cupy" if cuda_available() else "numpy", device_id, host_wait)


# --------------------------------------------------------------------------- events


class Event:
    """A point in a stream's work. ``done()`` polls, ``synchronize()`` blocks (GIL released)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Any = None) -> None:
        self._raw = raw  # a cupy.cuda.Event, or None for an event that is already complete

    @property
    def raw(self) -> Any:
        return self._raw

    def done(self) -> bool:
        return True if self._raw is None else bool(self._raw.done)

    def synchronize(self) -> None:
        if self._raw is not None:
            self._raw.synchronize()


COMPLETE = Event(None)


# --------------------------------------------------------------------------- streams


class Stream:
    """A named CUDA stream with its own cuBLAS handle, or an inline stream on the CPU.

    A stream is fed by one thread at a time (the executor holds its lock while it
    enqueues); that is what lets it own one cuBLAS handle without locking.

    ``priority``: ``high`` asks the device to start this stream's kernels before those of
    its process's normal streams whenever both wait (CUDA's stream priority: it reorders
    blocks waiting for SMs, preempts nothing, and leaves copies as they are). Inline on
    the CPU, it changes nothing.
    """

    def __init__(self, name: str, backend: Backend, priority: StreamPriority = "normal") -> None:
        if priority not in ("normal", "high"):
            raise ValueError(f"stream priority must be 'normal' or 'high', got {priority!r}")
        self.name = name
        self.backend = backend
        self.is_cuda = backend.is_cuda
        self.priority = priority
        self._raw: cupy.cuda.Stream | None = None
        self._cublas: int | None = None
        self._cublas_ws: Any = None
        if self.is_cuda:
            import cupy  # optional: cupy

            with cupy.cuda.Device(backend.device_id):
                self._raw = cupy.cuda.Stream(
                    non_blocking=True, priority=HIGH_PRIORITY if priority == "high" else None
                )

    @property
    def raw(self) -> Any:
        return self._raw

    @property
    def ptr(self) -> int:
        return 0 if self._raw is None else int(self._raw.ptr)

    @property
    def cublas_handle(self) -> int:
        """This stream's own cuBLAS handle, bound to it, with a fixed workspace.

        A fixed workspace keeps cuBLAS from allocating on its own, which would break
        CUDA graph capture and the no-allocation rule of commit.
        """
        if self._cublas is None:
            import cupy  # optional: cupy
            from cupy_backends.cuda.libs import cublas  # optional: cupy

            with cupy.cuda.Device(self.backend.device_id):
                handle = cublas.create()
                cublas.setStream(handle, self.ptr)
                set_ws = getattr(cublas, "setWorkspace", None)
                if set_ws is not None:
                    self._cublas_ws = cupy.cuda.Memory(CUBLAS_WORKSPACE_BYTES)
                    set_ws(handle, self._cublas_ws.ptr, CUBLAS_WORKSPACE_BYTES)
            self._cublas = handle
        return self._cublas

    def record(self) -> Event:
        if self._raw is None:
            return COMPLETE
        import cupy  # optional: cupy

        # blocking sync: a thread that waits on it sleeps instead of spinning a core
        # (CUDA's default), which on a node whose cores are the limit is a core lost
        ev = cupy.cuda.Event(block=True, disable_timing=True)
        ev.record(self._raw)
        return Event(ev)

    def wait(self, event: Event) -> None:
        """Future work on this stream waits for ``event`` (on the device, not the host)."""
        if self._raw is not None and event.raw is not None:
            self._raw.wait_event(event.raw)

    def synchronize(self) -> None:
        if self._raw is not None:
            self._raw.synchronize()

    def copy_h2d(self, dst: Any, src: np.ndarray) -> None:
        """Enqueue host -> device (asynchronous when ``src`` is pinned). Inline on the CPU."""
        if self._raw is None:
            np.copyto(dst, src.reshape(dst.shape))
            return
        from cupy.cuda import runtime  # optional: cupy

        runtime.memcpyAsync(
            int(dst.data.ptr),
            int(src.ctypes.data),
            int(src.nbytes),
            runtime.memcpyHostToDevice,
            self.ptr,
        )

    def copy_d2h(self, dst: np.ndarray, src: Any) -> None:
        """Enqueue device -> host (asynchronous when ``dst`` is pinned). Inline on the CPU."""
        if self._raw is None:
            np.copyto(dst, src.reshape(dst.shape))
            return
        from cupy.cuda import runtime  # optional: cupy

        runtime.memcpyAsync(
            int(dst.ctypes.data),
            int(src.data.ptr),
            int(dst.nbytes),
            runtime.memcpyDeviceToHost,
            self.ptr,
        )

    def __enter__(self) -> Stream:
        if self._raw is not None:
            self._raw.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._raw is not None:
            self._raw.__exit__(*exc)

    def close(self) -> None:
        if self._cublas is not None:
            from cupy_backends.cuda.libs import cublas  # optional: cupy

            try:
                cublas.destroy(self._cublas)
            except Exception:  # pragma: no cover - teardown
                logger.debug("cublas destroy failed", exc_info=True)
            self._cublas = None
            self._cublas_ws = None

    def __repr__(self) -> str:
        kind = "cuda" if self.is_cuda else "inline"
        return f"Stream({self.name!r}, {kind}, {self.priority})"


@dataclass
class StreamSet:
    """The executor's fixed streams: host-to-device, compute (one or more), device-to-host."""

    backend: Backend
    n_compute: int = 1
    h2d: Stream = field(init=False)
    compute: list[Stream] = field(init=False)
    d2h: Stream = field(init=False)
    _rr: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.h2d = Stream("h2d", self.backend)
        self.compute = [Stream(f"compute{i}", self.backend) for i in range(self.n_compute)]
        self.d2h = Stream("d2h", self.backend)

    _pinned: dict = field(default_factory=dict, init=False)

    def next_compute(self) -> Stream:
        with self._lock:
            s = self.compute[self._rr % len(self.compute)]
            self._rr += 1
            return s

    def compute_for(self, key: Any) -> Stream:
        """The compute stream that ``key`` (an arena) always runs on: streams are handed
        out round-robin at a key's first sight, then kept. A CUDA graph is captured per
        arena and stream (it uses that stream's cuBLAS workspace), so a stable pairing means
        one graph per in-flight arena, all captured at warm-up, while the in-flight arenas
        still spread over the streams; round-robin per batch paired them anew and kept
        capturing during serving."""
        with self._lock:
            i = self._pinned.get(key)
            if i is None:
                if len(self._pinned) >= 4096:  # arenas come from a bounded pool; a guard
                    self._pinned.clear()
                i = self._pinned[key] = self._rr % len(self.compute)
                self._rr += 1
            return self.compute[i]

    def all(self) -> list[Stream]:
        return [self.h2d, *self.compute, self.d2h]

    def synchronize(self) -> None:
        for s in self.all():
            s.synchronize()

    def close(self) -> None:
        for s in self.all():
            s.close()
