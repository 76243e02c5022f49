"""The GPU's busy time and JPEG-engine utilisation over a load level, from NVML, for any
system.

``bench_e2e`` runs one ``DeviceSampler`` around each level: a thread reads every device's
utilisation (``nvmlDeviceGetUtilizationRates().gpu``: the share of the sample period in which
any kernel ran -- not how many SMs it kept busy) and its JPEG engines'
(``nvmlDeviceGetJpgUtilization``, A100/H100/H200) every ``every_s``, and ``result()`` gives
the means over the level and every device of the node, as fractions. It reads the device,
not a process, so it measures Ferry and the peers alike -- whether a system's decoder uses
the hardware JPEG engines at all shows as ``jpeg_util`` near 0. It also keeps the peak of
each device's memory in use (``nvmlDeviceGetMemoryInfo``) and of each process's on it
(``nvmlDeviceGetComputeRunningProcesses``; none under MPS, which runs them as one): how close
a level came to the GPU's size, and what a replica holds beside its pool.

NVML comes from ``nvidia-ml-py`` where installed, else from the copy Ray ships
(``ray._private.thirdparty.pynvml``). Without either, or without a driver, ``result()`` is
None and the level is measured as before.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from types import ModuleType
from typing import Any


@functools.cache
def load_nvml() -> ModuleType | None:
    """NVML's Python binding, initialised once a process; None where there is none or no
    driver. (Call it before a timed span: the first call may import Ray.)"""
    try:
        import pynvml as nvml  # nvidia-ml-py
    except ImportError:
        try:
            from ray._private.thirdparty import pynvml as nvml  # Ray's own copy
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except Exception:  # no driver, no device: nothing to sample
        return None
    return nvml


class DeviceSampler:
    """``with DeviceSampler() as s: ...`` then ``s.result()``: the span's mean utilisations."""

    def __init__(self, every_s: float = 0.25, nvml: Any = None) -> None:
        self.every_s = every_s
        self._nvml = nvml if nvml is not None else load_nvml()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sm: list[float] = []
        self._jpeg: list[float] = []
        # keyed by the device's index: NVML's handles are ctypes pointers, which are not
        # hashable (every row of 2026-12-06 lost its memory figure to "unhashable type")
        self._mem: dict[int, int] = {}  # device index -> peak bytes in use
        self._total: dict[int, int] = {}  # device index -> its bytes
        self._procs: dict[int, int] = {}  # pid -> its largest reading on any one device
        self.failed = False  # a reading failed: the means cover only the span before it
        # why a memory reading failed (the first failure): every H100 row of 2026-12-06 had no
        # memory figure, with no word of the cause
        self.mem_error: str | None = None
        self.devices = 0

    def _handles(self) -> list[Any]:
        nvml = self._nvml
        return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def _sample(self, handles: list[Any]) -> None:
        nvml = self._nvml
        for i, h in enumerate(handles):
            self._sm.append(nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0)
            with contextlib.suppress(Exception):  # a GPU without JPEG engines: no reading
                self._jpeg.append(nvml.nvmlDeviceGetJpgUtilization(h)[0] / 100.0)
            try:  # memory figures are extras: never fatal, but a failure is said (mem_error)
                m = nvml.nvmlDeviceGetMemoryInfo(h)
                self._total[i] = int(m.total)
                self._mem[i] = max(self._mem.get(i, 0), int(m.used))
            except Exception as exc:
                self.mem_error = self.mem_error or f"nvmlDeviceGetMemoryInfo: {exc!r}"[:300]
            try:
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = int(p.usedGpuMemory or 0)  # None where the driver withholds it
                    self._procs[p.pid] = max(self._procs.get(p.pid, 0), used)
            except Exception as exc:
                self.mem_error = self.mem_error or f"{exc!r} listing processes"[:300]

    def _run(self, handles: list[Any]) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self._sample(handles)
            except Exception:  # a reading must never fail the level: it says so instead
                self.failed = True
                return

    def __enter__(self) -> DeviceSampler:
        if self._nvml is not None:
            try:
                handles = self._handles()
            except Exception:
                self._nvml = None
                return self
            self.devices = len(handles)
            self._thread = threading.Thread(
                target=self._run, args=(handles,), name="device-sampler", daemon=True
            )
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _memory(self) -> dict[str, Any]:
        """The memory fields of ``result`` (None and [] where there was no reading)."""
        mib = 1 << 20
        mem, total, procs = dict(self._mem), dict(self._total), list(self._procs.values())
        full = [h for h in mem if total.get(h)]  # (a device of size 0 is no reading)
        h = max(full, key=lambda h: mem[h] / total[h], default=None)
        return {
            "gpu_mem_peak_mib": None if h is None else mem[h] // mib,
            "gpu_mem_total_mib": None if h is None else total[h] // mib,
            "gpu_proc_mem_mib": sorted((b // mib for b in procs), reverse=True),
        }

    def result(self) -> dict[str, Any] | None:
        """``gpu_util`` and ``gpu_jpeg_util`` (means, 0-1; the latter None on a GPU without
        JPEG engines), ``gpu_samples`` (readings: devices x rounds), ``gpu_devices``,
        ``gpu_sampling_failed``, and in MiB ``gpu_mem_peak_mib`` / ``gpu_mem_total_mib``
        (the fullest device's peak in use, and its size) and ``gpu_proc_mem_mib`` (each
        process's peak, largest first); None where nothing was sampled."""
        if not self._sm:
            return None
        return {
            **self._memory(),
            "gpu_util": round(sum(self._sm) / len(self._sm), 3),
            "gpu_jpeg_util": round(sum(self._jpeg) / len(self._jpeg), 3) if self._jpeg else None,
            "gpu_samples": len(self._sm),
            "gpu_devices": self.devices,
            "gpu_sampling_failed": self.failed,
            **({"gpu_mem_error": self.mem_error} if self.mem_error else {}),
        }
