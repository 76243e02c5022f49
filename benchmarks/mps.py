"""CUDA MPS for a benchmark run: one MPS server for the GPU, every CUDA process started
meanwhile (a ``serve run``'s replicas) its client, quit at the end.

    with mps_server(args.mps):
        ...  # start the systems under test
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

CONTROL = "nvidia-cuda-mps-control"


@contextlib.contextmanager
def mps_server(on: bool) -> Iterator[bool]:
    """With ``on``: start ``nvidia-cuda-mps-control -d`` in a pipe directory of its own, put
    that directory in this process's environment (its children inherit it, and connect as
    clients), and quit the server on leaving. Yields whether MPS is on."""
    if not on:
        yield False
        return
    if shutil.which(CONTROL) is None:
        raise SystemExit(f"--mps: {CONTROL} is not on PATH")
    dirs = {
        "CUDA_MPS_PIPE_DIRECTORY": tempfile.mkdtemp(prefix="mps-pipe-"),
        "CUDA_MPS_LOG_DIRECTORY": tempfile.mkdtemp(prefix="mps-log-"),
    }
    saved = {k: os.environ.get(k) for k in dirs}
    os.environ.update(dirs)
    subprocess.run([CONTROL, "-d"], check=True)
    try:
        yield True
    finally:
        subprocess.run([CONTROL], input=b"quit\n", check=False)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
