"""How a host thread waits for the GPU in this process: the primary context's scheduling
flag (``executor.host_wait``).

CUDA's default (``auto``) spins while fewer CUDA contexts than cores are active in the
process: a thread in ``cudaEventSynchronize`` or ``cudaStreamSynchronize`` keeps a core busy
until the GPU is done. Ferry's own completion waits already sleep (a blocking event), but the
libraries in the GPU-owning process do not: nvImageCodec's hardware JPEG decoder waits for
its previous batch with a plain ``cudaEventSynchronize`` on its own threads, and torch's and
cupy's synchronous calls spin the same way. On the H200 with 8 replicas, nvImageCodec's
threads used up to 6 of the 16 cores at 1,024 clients (``benchmarks/results/e2e.json``,
``server_threads``). ``sleep`` (``CU_CTX_SCHED_BLOCKING_SYNC``) makes every such wait block
on an OS primitive instead, at the cost of a wake-up (microseconds) per wait.

The flag belongs to the device's primary context, which torch, cupy and nvImageCodec all
share: it is set once, before the context starts, through the driver API (no CUDA runtime or
library is needed). Where the context is already active, the driver is asked anyway and the
flag read back: ``HostWait.applied`` says what the process really has.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

HostWaitName = Literal["auto", "spin", "yield", "sleep"]
FLAGS: dict[str, int] = {"auto": 0, "spin": 1, "yield": 2, "sleep": 4}  # CU_CTX_SCHED_*
SCHED_MASK = 0x07


@dataclass(frozen=True)
class HostWait:
    """What a device's primary context has after ``set_host_wait``: ``wanted`` the mode
    asked for, ``flags`` its scheduling bits read back (None: no driver), ``applied`` whether
    they are the wanted ones, ``why`` when not."""

    wanted: str
    flags: int | None
    applied: bool
    why: str = ""

    @property
    def mode(self) -> str:
        """The scheduling the context has, by name (``unknown`` without a driver)."""
        if self.flags is None:
            return "unknown"
        names = {v: k for k, v in FLAGS.items()}
        return names.get(self.flags & SCHED_MASK, f"flags {self.flags:#x}")


_done: dict[int, HostWait] = {}
_lock = threading.Lock()


def _driver() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def set_host_wait(mode: str, device_id: int = 0) -> HostWait:
    """Give device ``device_id``'s primary context the scheduling ``mode`` (once per process
    and device; later calls return the first answer). ``auto`` changes nothing."""
    if mode not in FLAGS:
        raise ValueError(f"host_wait must be one of {sorted(FLAGS)}, got {mode!r}")
    with _lock:
        got = _done.get(device_id)
        if got is None:
            got = _done[device_id] = _apply(mode, device_id, _driver())
            log = logger.warning if not got.applied and mode != "auto" else logger.info
            log("CUDA host waits on device %d: %s (asked %s)%s", device_id, got.mode, mode,
                f": {got.why}" if got.why else "")  # fmt: skip
        elif got.wanted != mode:
            logger.warning(
                "host_wait %r asked for device %d after %r was set: kept", mode, device_id,
                got.wanted,
            )  # fmt: skip
        return got


def _apply(mode: str, device_id: int, cuda: ctypes.CDLL | None) -> HostWait:
    """Set the flag through the driver API and read it back."""
    if cuda is None:
        return HostWait(mode, None, mode == "auto", "no CUDA driver in this process")
    dev = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), device_id) != 0:
        return HostWait(mode, None, mode == "auto", f"the driver has no device {device_id}")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    if cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
        return HostWait(mode, None, False, "cuDevicePrimaryCtxGetState failed")
    want = FLAGS[mode]
    if mode == "auto" or flags.value & SCHED_MASK == want:
        return HostWait(mode, flags.value, True)
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or (
        cuda.cuDevicePrimaryCtxSetFlags
    )
    rc = set_flags(dev, ctypes.c_uint((flags.value & ~SCHED_MASK) | want))
    cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    ok = rc == 0 and flags.value & SCHED_MASK == want
    why = "" if ok else (
        f"the driver answered {rc}" + (" (the context was already active)" if active.value else "")
    )  # fmt: skip
    return HostWait(mode, flags.value, ok, why)


def host_wait_of(device_id: int = 0) -> HostWait | None:
    """What ``set_host_wait`` gave this device in this process (None: never asked)."""
    with _lock:
        return _done.get(device_id)
