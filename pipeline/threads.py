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
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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


class QueueThreads:
    """Named threads (one per name in ``names``, each named so in the OS) started at the first
    ``put``, that take the items put on one queue in order and run ``handle(*item)`` for each,
    until ``close``. ``handle`` must not raise: a failure is its own to report.

    The thread objects are made before the lock is taken: a garbage collection while it is
    held may finalize an object (a batch's lease) whose finalizer puts an item here."""

    _STOP = object()

    def __init__(self, names: list[str], handle: Callable[..., Any]) -> None:
        if not names:
            raise ValueError("QueueThreads needs at least one thread")
        self.names = names
        self._handle = handle
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def put(self, item: tuple) -> None:
        """Queue ``item`` for a thread; after ``close`` it raises ``RuntimeError``."""
        if not self._threads or self._closed:
            self._start()
        self._q.put(item)

    def _start(self) -> None:
        made = [threading.Thread(target=self._work, name=n, daemon=True) for n in self.names]
        with self._lock:
            closed = self._closed
            if not closed and not self._threads:
                for t in made:
                    t.start()  # (under the lock: close() never joins a thread not started)
                self._threads = made
        if closed:
            raise RuntimeError(f"{self.names[0]}: its threads are closed")

    def _work(self) -> None:
        name_os_thread()
        get, handle = self._q.get, self._handle
        while True:
            item = get()
            if item is self._STOP:
                return
            handle(*item)
            del item  # (the thread keeps no reference to an item while it waits)

    def close(self, timeout: float = 5.0) -> None:
        """Let the threads finish the items queued, then end them (each joined for up to
        ``timeout`` s)."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._q.put(self._STOP)
        for t in threads:
            t.join(timeout)
