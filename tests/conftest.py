"""Shared test setup: the ``gpu`` marker is skipped where no CUDA device is visible."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_collection_modifyitems(config, items):
    from pipeline.device import cuda_available

    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Every process the suite starts -- local Ray clusters, `serve run`, Serve's HAProxy, locust --
# inherits this run id (loadtest/procs.py); a run leaves none of them behind. At the end,
# whatever still carries it and is not a child that ends with this process (torch's compile
# workers) -- an orphan -- is named, stopped by PID, and fails the run.
from loadtest import procs  # noqa: E402

RUN_ID = procs.new_run_id("pytest")
os.environ[procs.MARK] = RUN_ID
ORPHAN_WAIT_S = 30.0  # Ray's daemons end a few seconds after ray.shutdown() returns


def pytest_sessionfinish(session, exitstatus):
    left = procs.wait_gone(RUN_ID, ORPHAN_WAIT_S)
    if not left:
        return
    for pid in left:  # stop them, not this run's own children (they end with it)
        procs._signal(pid, procs.signal.SIGKILL)
    lines = "\n".join(f"  {pid} {cmd[:160]}" for pid, cmd in sorted(left.items()))
    session.config.get_terminal_writer().line(
        f"\nFAILED: the test run left {len(left)} process(es) behind (stopped now):\n{lines}",
        red=True,
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
