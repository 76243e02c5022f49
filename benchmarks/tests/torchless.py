"""A check shared by the peers' tests: a module and its Serve app build without torch."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def assert_builds_without_torch(module: str, args: dict) -> None:
    """``module.build_app(args)`` in a fresh interpreter imports neither torch nor
    torchvision (the driver that deploys a peer may have neither)."""
    code = (
        "import sys\n"
        f"from benchmarks.peers import {module} as m\n"
        f"m.build_app({args!r})\n"
        "bad = [k for k in ('torch', 'torchvision') if k in sys.modules]\n"
        "assert not bad, bad\n"
    )
    # ROOT first, the caller's path kept: where Ray is on PYTHONPATH (the GPU machine's
    # bundle) it must stay importable
    path = [ROOT, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]
