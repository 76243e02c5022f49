"""benchmarks.device_sampler: the GPU's utilisation over a level, from NVML.

This machine has no GPU: the real NVML (Ray's copy) must give None, not fail the level. The
means are checked against a stand-in NVML of two devices, one without JPEG engines."""

from __future__ import annotations

import shutil
import threading
import time
from types import SimpleNamespace

import pytest

from benchmarks.device_sampler import DeviceSampler, load_nvml


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a driver")
def test_without_a_driver_there_is_nothing_to_sample_and_the_level_goes_on():
    assert load_nvml() is None  # Ray's pynvml is importable here, but no driver answers
    with DeviceSampler(every_s=0.01) as s:
        pass
    assert s.result() is None


class Handle:
    """A device handle as NVML's binding gives it: a ctypes pointer, which is not hashable."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, i: int) -> None:
        self.i = i


def _i(h: int | Handle) -> int:
    return h.i if isinstance(h, Handle) else h


class StandInNvml:
    """Device 0 has JPEG engines, device 1 has none; each reading is the next of a list.
    Memory: device 0 of 80 GiB, its in-use and its two processes' growing each reading (the
    second process's withheld at first, as a driver may); device 1 has no memory reading."""

    def __init__(self, sm: list[list[int]], jpg: list[int]) -> None:
        self.sm, self.jpg = sm, jpg
        self.reads = [0, 0]
        self.enough = threading.Event()

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        return Handle(i)

    def nvmlDeviceGetUtilizationRates(self, h: int | Handle) -> SimpleNamespace:
        h = _i(h)
        k = self.reads[h]
        self.reads[h] += 1
        if h == 1 and self.reads[1] >= len(self.sm[1]):
            self.enough.set()
        return SimpleNamespace(gpu=self.sm[h][min(k, len(self.sm[h]) - 1)])

    def nvmlDeviceGetMemoryInfo(self, h: int | Handle) -> SimpleNamespace:
        h = _i(h)
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(total=80 << 30, used=(10 << 30) * self.reads[0])

    def nvmlDeviceGetComputeRunningProcesses(self, h: int | Handle) -> list[SimpleNamespace]:
        h = _i(h)
        k = self.reads[0]
        return [
            SimpleNamespace(pid=7, usedGpuMemory=(k << 30)),
            SimpleNamespace(pid=8, usedGpuMemory=None if k < 2 else (3 << 30)),
        ]

    def nvmlDeviceGetJpgUtilization(self, h: int | Handle) -> tuple[int, int]:
        h = _i(h)
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self.jpg[min(self.reads[0] - 1, len(self.jpg) - 1)], 1000


def test_the_means_over_the_level_from_every_device():
    nvml = StandInNvml(sm=[[50, 70], [10, 30]], jpg=[20, 40])
    with DeviceSampler(every_s=0.001, nvml=nvml) as s:
        assert nvml.enough.wait(5)
    # the sampler stopped at __exit__: what it read is what it reports
    got = s.result()
    assert got["gpu_devices"] == 2 and not got["gpu_sampling_failed"]
    n = got["gpu_samples"]
    assert n >= 4 and n % 2 == 0  # a reading of each device a round
    assert 0.1 <= got["gpu_util"] <= 0.7
    assert 0.2 <= got["gpu_jpeg_util"] <= 0.4  # device 0's only
    reads = list(nvml.reads)
    time.sleep(0.05)  # fifty of its periods: a thread still running would read again
    assert nvml.reads == reads


def test_two_rounds_give_their_exact_means():
    nvml = StandInNvml(sm=[[50, 70], [10, 30]], jpg=[20, 40])
    s = DeviceSampler(nvml=nvml)
    handles = s._handles()
    s._sample(handles)
    s._sample(handles)
    assert s.result() == {
        "gpu_mem_peak_mib": 20 << 10,  # device 0's second reading, 20 GiB
        "gpu_mem_total_mib": 80 << 10,
        "gpu_proc_mem_mib": [3 << 10, 2 << 10],  # each process's peak, largest first
        "gpu_util": 0.4,
        "gpu_jpeg_util": 0.3,
        "gpu_samples": 4,
        "gpu_devices": 0,  # (set on entering the span; this test samples by hand)
        "gpu_sampling_failed": False,
        "gpu_mem_error": "nvmlDeviceGetMemoryInfo: RuntimeError('NVML_ERROR_NOT_SUPPORTED')",
    }


def test_a_process_listing_that_fails_keeps_the_memory_figures_and_says_why():
    """(An NVML binding older than the driver fails ``nvmlDeviceGetComputeRunningProcesses``:
    the device's memory is still read, and the row says what failed.)"""

    class OldBinding(StandInNvml):
        def nvmlDeviceGetComputeRunningProcesses(self, h: int | Handle) -> list[SimpleNamespace]:
            raise RuntimeError("NVML_ERROR_FUNCTION_NOT_FOUND")

    s = DeviceSampler(nvml=OldBinding(sm=[[50], [10]], jpg=[20]))
    s._sample([0])
    got = s.result()
    assert got["gpu_mem_peak_mib"] == 10 << 10 and got["gpu_mem_total_mib"] == 80 << 10
    assert got["gpu_proc_mem_mib"] == []
    assert "NVML_ERROR_FUNCTION_NOT_FOUND" in got["gpu_mem_error"]


def test_a_device_of_size_zero_gives_no_memory_figure_and_no_error():
    """(A MIG slice or a withholding driver may say 0: the level goes on without the peak.)"""
    s = DeviceSampler(nvml=StandInNvml(sm=[[50], [10]], jpg=[20]))
    s._sm, s._mem, s._total = [0.5], {0: 1 << 30}, {0: 0}
    got = s.result()
    assert got["gpu_mem_peak_mib"] is None and got["gpu_mem_total_mib"] is None
    assert got["gpu_util"] == 0.5
