"""Ferry's worker threads, named in the OS as in Python.

Python names its threads only for itself; the OS (``/proc/<pid>/task/<tid>/comm``, ``top
-H``, ``perf``, ``profile_pipeline.py``'s CPU by thread) sees every one of them under the
name of the thread that made it. Naming ours there splits a replica's CPU into Ferry's
decode, submit and receive threads, the event loop Serve runs (``ferry-loop``: the ingress
names it at its first classify request), and the native threads of gRPC, CUDA and
nvImageCodec.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

_PR_SET_NAME = 15
_libc = None


def name_os_thread(name: str | None = None) -> None:
    """Give the calling thread ``name`` (default: its Python name) in the OS, cut to the 15
    bytes Linux keeps. Elsewhere, or where prctl is missing, nothing happens."""
    global _libc
    if not sys.platform.startswith("linux"):
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        raw = (name or threading.current_thread().name).encode("utf-8", "replace")[:15]
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def thread_pool(workers: int, prefix: str) -> ThreadPoolExecutor:
    """A ``ThreadPoolExecutor`` whose threads carry ``prefix_N`` in Python and in the OS."""
    return ThreadPoolExecutor(workers, thread_name_prefix=prefix, initializer=name_os_thread)
