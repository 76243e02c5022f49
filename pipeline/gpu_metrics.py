"""GPU utilisation, memory and JPEG-engine utilisation from NVML, as Ferry metrics.

``start(device_id)`` in a process that holds a CUDA device starts one daemon thread
(``ferry-nvml``) that samples the device every ``every_s`` and records
``ferry_gpu_utilization``, ``ferry_gpu_memory_used_bytes``, ``ferry_gpu_memory_total_bytes``
and ``ferry_gpu_jpeg_utilization`` (``pipeline.metrics.set_gpu``). It needs ``nvidia-ml-py``
(the ``nvml`` extra); without it, or without a driver, it logs once and does nothing. The
device is found by its PCI bus id, so the CUDA ordinal a process sees (Ray narrows
``CUDA_VISIBLE_DEVICES``) and NVML's ordinal (all devices) cannot be confused. Replicas that
share a GPU each report it: the ``gpu`` label (its PCI bus id) tells which series are one
device.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from . import metrics
from .threads import name_os_thread

logger = logging.getLogger(__name__)

_started: set[int] = set()
_lock = threading.Lock()


def sample(nvml: Any, handle: Any) -> dict[str, float]:
    """One reading of a device: fractions in [0, 1] and bytes."""
    out: dict[str, float] = {}
    util = nvml.nvmlDeviceGetUtilizationRates(handle)
    out["utilization"] = util.gpu / 100.0
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    out["memory_used_bytes"] = float(mem.used)
    out["memory_total_bytes"] = float(mem.total)
    try:  # the JPEG engines (A100, H100, H200...); absent on GPUs without them
        jpg, _period_us = nvml.nvmlDeviceGetJpgUtilization(handle)
        out["jpeg_utilization"] = jpg / 100.0
    except Exception:
        pass
    return out


def pci_bus_id(device_id: int) -> str:
    import cupy  # optional: cupy

    return cupy.cuda.Device(device_id).pci_bus_id


def start(device_id: int, every_s: float = 1.0) -> bool:
    """Sample this process's CUDA device ``device_id``; False when NVML is not available."""
    with _lock:
        if device_id in _started:
            return True
        try:
            import pynvml as nvml  # nvidia-ml-py

            nvml.nvmlInit()
            bus = pci_bus_id(device_id)
            handle = nvml.nvmlDeviceGetHandleByPciBusId(bus)
            sample(nvml, handle)
        except Exception as exc:
            logger.info("no GPU metrics (NVML: %s); pip install nvidia-ml-py for them", exc)
            return False
        _started.add(device_id)

    def run() -> None:
        name_os_thread()
        while True:
            try:
                metrics.set_gpu(bus, sample(nvml, handle))
            except Exception:  # a metric must never take the replica down
                logger.exception("NVML sample failed")
            time.sleep(every_s)

    threading.Thread(target=run, name="ferry-nvml", daemon=True).start()
    return True
