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
    clients), and quit the server on leaving. Yields whether MPS is on. Its logs go to
    ``$MPS_LOG_DIR`` where that is set (gpu_e2e.sh: under ``$OUT``, so they come back), else
    to a temporary directory."""
    if not on:
        yield False
        return
    if shutil.which(CONTROL) is None:
        raise SystemExit(f"--mps: {CONTROL} is not on PATH")
    dirs = {
        "CUDA_MPS_PIPE_DIRECTORY": tempfile.mkdtemp(prefix="mps-pipe-"),
        "CUDA_MPS_LOG_DIRECTORY": _log_dir(),
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


def _log_dir() -> str:
    where = os.environ.get("MPS_LOG_DIR")
    if where:
        os.makedirs(where, exist_ok=True)
        return where
    return tempfile.mkdtemp(prefix="mps-log-")


def servers() -> list[str] | None:
    """The MPS servers running now (``get_server_list``: a server starts at its first client,
    so [] means no CUDA process has connected), or None where MPS is not on here."""
    if not os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or shutil.which(CONTROL) is None:
        return None
    r = subprocess.run(
        [CONTROL], input=b"get_server_list\n", capture_output=True, timeout=10, check=False
    )
    return r.stdout.decode(errors="replace").split()
