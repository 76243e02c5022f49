"""One compile of a module at a time on a machine: replicas that start together do not all
compile the same graphs at once.

Eight replicas of a torch model on one GPU start together, and each compiles every bucket
with ``torch.compile`` -- inductor's own worker pool a process, eight at once on the node's
cores. Behind ``compile_gate(key)`` the first process to come compiles alone and so fills
inductor's on-disk caches (``/tmp/torchinductor_<user>``); the others wait for it, then
compile at once from those caches. A key whose compile has finished on this machine (its
marker file) is not waited on again. As the expert Ray Serve peer does
(``benchmarks/peers/rayserve_expert.py``, ``_warm_once``).

Nothing is shared but the caches: a process that waited compiles its own graphs. A holder
that fails or dies leaves no marker (its lock goes with its process), and the next waiter
compiles alone in its place; a wait longer than ``timeout_s`` gives up the gate and compiles.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Iterator

logger = logging.getLogger(__name__)

POLL_S = 0.25


def gate_dir() -> str:
    return os.path.join(tempfile.gettempdir(), f"ferry-compile-{os.getuid()}")


@contextlib.contextmanager
def compile_gate(
    key: str, directory: str | None = None, timeout_s: float = 1800.0
) -> Iterator[bool]:
    """Hold the machine's gate of ``key`` for a compile: yields True where this process
    compiles first (alone; the marker is written when the block ends without an error),
    False where another did before (this one then compiles from the caches, ungated)."""
    d = directory or gate_dir()
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(key.encode()).hexdigest()[:20]
    marker, lock_path = os.path.join(d, name + ".done"), os.path.join(d, name + ".lock")
    if os.path.exists(marker):
        yield False
        return
    with open(lock_path, "a") as lock:
        t0, waited = time.monotonic(), False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited:
                    logger.info("waiting for another process's compile of %s", key)
                    waited = True
                if time.monotonic() - t0 > timeout_s:
                    logger.warning("compile of %s: gave up the wait after %.0f s", key, timeout_s)
                    yield False
                    return
                time.sleep(POLL_S)
        try:
            if os.path.exists(marker):  # compiled while this one waited: from the caches
                fcntl.flock(lock, fcntl.LOCK_UN)
                logger.info(
                    "compile of %s: from the caches after %.1f s", key, time.monotonic() - t0
                )
                yield False
                return
            yield True
            with open(marker, "w") as f:
                f.write(key + "\n")
        finally:
            with contextlib.suppress(OSError, ValueError):
                fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def torch_gate(key: str, directory: str | None = None) -> Iterator[bool]:
    """``compile_gate(key)``; a process that compiles after another (from its caches) does
    so without inductor's worker pool: cache hits compile nothing, and seven followers of an
    8-replica start each forked a pool of one worker a core (py-spy on an H100, 2026-12-06),
    every worker importing torch, while they traced their graphs on the same cores."""
    import torch._inductor.config as ic  # optional: torch

    with compile_gate(key, directory) as first:
        threads = ic.compile_threads
        if not first:
            ic.compile_threads = 1
        try:
            yield first
        finally:
            ic.compile_threads = threads
