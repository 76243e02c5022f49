"""``executor.host_wait`` on a real driver: the GPU executor's process gets the scheduling
flag it asked for on the primary context that cupy, torch and nvImageCodec share, its
waits still complete, and where the context was already running the executor reports what
the driver really has (each case in a fresh child process: a context's flags are per
process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from pipeline.device import cuda_available

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs a CUDA device")

CHILD = textwrap.dedent(
    r"""
    import ctypes, json, sys
    import numpy as np
    mode, early = sys.argv[1], sys.argv[2] == "early"
    import cupy
    if early:  # the context starts before the executor asks
        cupy.zeros(4).sum().item()
    from pipeline.config import ExecutorConfig
    from pipeline.executor import GpuExecutor
    ex = GpuExecutor(ExecutorConfig(backend="cupy", host_wait=mode))
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    ev = cupy.cuda.Event(block=False, disable_timing=True)  # a plain event: the context's flag
    (a * 2).sum(); ev.record(); ev.synchronize()
    cupy.cuda.get_current_stream().synchronize()
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), 0)
    cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    print(json.dumps({"reported": ex.stats()["host_wait"], "flags": flags.value & 7,
                      "active": active.value, "sum": float((a * 2).sum().item())}))
    """
)


def _child(mode: str, when: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, when], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode,flags", [("sleep", 4), ("spin", 1), ("auto", 0)])
def test_the_executor_gives_its_context_the_asked_scheduling(mode: str, flags: int) -> None:
    got = _child(mode, "fresh")
    assert got["flags"] == flags and got["reported"] == mode and got["active"] == 1
    want = float(np.arange(1 << 20, dtype=np.float64).sum() * 2)
    assert abs(got["sum"] - want) < 1e-4 * want  # the waited-for work is there


def test_a_context_already_running_is_reported_as_the_driver_has_it() -> None:
    got = _child("sleep", "early")
    names = {0: "auto", 1: "spin", 2: "yield", 4: "sleep"}
    assert got["reported"] == names[got["flags"]]
