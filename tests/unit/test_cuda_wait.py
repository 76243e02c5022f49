"""``executor.host_wait``: the primary context's scheduling flag, set through the driver
API before the context starts and read back (pipeline/cuda_wait.py).

This machine has no CUDA driver, so the driver here is a stand-in with the four calls the
module makes and the behaviour the CUDA driver API documents: flags of an inactive primary
context can be set; this stand-in refuses a change on an active one (the older drivers'
``CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE``), which is the case the module must report rather than
assume. On the GPU, tests/gpu/test_host_wait_gpu.py checks the real driver.
"""

from __future__ import annotations

import ctypes
import logging

import pytest

from pipeline import cuda_wait as W
from pipeline.config import ExecutorConfig
from pipeline.device import Backend, select_backend


class Driver:
    """The driver API calls ``cuda_wait`` makes, on one device (ordinal 0)."""

    def __init__(self, flags: int = 0, active: bool = False) -> None:
        self.flags, self.active, self.sets = flags, active, []

    def cuInit(self, _flags: int) -> int:
        return 0

    def cuDeviceGet(self, ref: object, ordinal: int) -> int:
        ref._obj.value = ordinal  # type: ignore[attr-defined]
        return 0 if ordinal == 0 else 101  # CUDA_ERROR_INVALID_DEVICE

    def cuDevicePrimaryCtxGetState(self, dev: ctypes.c_int, flags: object, active: object) -> int:
        flags._obj.value, active._obj.value = self.flags, int(self.active)  # type: ignore[attr-defined]
        return 0

    def cuDevicePrimaryCtxSetFlags_v2(self, dev: ctypes.c_int, flags: ctypes.c_uint) -> int:
        self.sets.append(flags.value)
        if self.active:
            return 708  # CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE
        self.flags = flags.value
        return 0


def test_sleep_is_set_on_an_inactive_context_and_read_back() -> None:
    drv = Driver(flags=0x10)  # another flag (LMEM_RESIZE_TO_MAX) is kept
    got = W._apply("sleep", 0, drv)  # type: ignore[arg-type]
    assert got.applied and got.mode == "sleep" and got.why == ""
    assert drv.sets == [0x14] and got.flags == 0x14


def test_a_refused_change_is_reported_not_assumed() -> None:
    drv = Driver(flags=0, active=True)
    got = W._apply("sleep", 0, drv)  # type: ignore[arg-type]
    assert not got.applied and got.mode == "auto"
    assert "708" in got.why and "already active" in got.why


def test_auto_changes_nothing_and_a_flag_already_there_is_not_set_again() -> None:
    drv = Driver(flags=0x04, active=True)
    assert W._apply("auto", 0, drv).applied  # type: ignore[arg-type]
    assert W._apply("sleep", 0, drv).applied  # type: ignore[arg-type]
    assert drv.sets == []


def test_no_driver_or_no_device_is_said_in_words() -> None:
    assert W._apply("auto", 0, None).applied
    none = W._apply("sleep", 0, None)
    assert not none.applied and none.mode == "unknown" and "no CUDA driver" in none.why
    missing = W._apply("spin", 3, Driver())  # type: ignore[arg-type]
    assert not missing.applied and "no device 3" in missing.why


def test_the_process_sets_a_device_once_and_keeps_the_first_answer(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    drv = Driver()
    monkeypatch.setattr(W, "_driver", lambda: drv)
    monkeypatch.setattr(W, "_done", {})
    assert W.host_wait_of(0) is None
    with caplog.at_level(logging.INFO, logger="pipeline.cuda_wait"):
        first = W.set_host_wait("sleep", 0)
        again = W.set_host_wait("spin", 0)
    assert first.applied and again is first and drv.sets == [0x04]
    assert W.host_wait_of(0) is first
    assert any("after 'sleep' was set: kept" in r.getMessage() for r in caplog.records)


def test_unknown_mode_is_refused_by_the_config_and_the_module() -> None:
    with pytest.raises(ValueError):
        ExecutorConfig(host_wait="busy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="host_wait must be one of"):
        W.set_host_wait("busy", 0)
    assert ExecutorConfig().host_wait == "auto"


def test_the_cpu_backend_never_touches_the_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(W, "_driver", lambda: pytest.fail("the driver was asked"))
    backend = select_backend("numpy", 0, "sleep")
    backend.activate()
    assert backend == Backend("numpy", 0) and not backend.is_cuda
