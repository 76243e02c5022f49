"""Shared test setup: the ``gpu`` marker is skipped where no CUDA device is visible."""

from __future__ import annotations

import os
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# integration tests that bring up a Ray of their own, not the session's: `ray start` and
# `serve run` on README's port 8000, and the idle-gauge test's
OWN_RAY = (
    "tests/integration/test_00_serve_config.py",
    "tests/integration/test_01_readme.py",
    "tests/integration/test_02_idle_gauges.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under pytest-xdist (pyproject's addopts: ``-n 2``) one worker runs the integration
    tests of the session's local Ray (``tests/integration/conftest.py``), in collection
    order -- they share it and its ports -- while the other runs, beside them, those that
    start a Ray of their own (``OWN_RAY``: one after the other, in collection order; two of
    them on README's port 8000), then the unit and benchmark tests. (On 2026-12-05 the integration
    worker ran 590 s of tests while the other idled after 124; the two own-Ray tests are
    117 s of the 590. Two local Rays on one machine each take free ports: checked.) The
    simulated two-node cluster (test_placement_cluster) stays on the integration worker: on
    2026-12-06 it ran here, after the two, and CI took no less time (737 s against 729: the
    two cores are the limit, not the split), while the integration tests it then ran beside
    failed their timing (CI at d5a31d5: three of them). (A scheduler of our own: xdist's
    ``loadgroup`` renames node ids, which pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling  # only ever called under xdist

    class IntegrationTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(OWN_RAY):
                return "own_ray"
            return "integration" if nodeid.startswith("tests/integration/") else nodeid

    return IntegrationTogether(config, log)


TIMELINE = os.environ.get("FERRY_TEST_TIMELINE")  # a file: when each test ran, on which worker


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures deploy anything
def pytest_runtest_setup(item):
    """With ``FERRY_TEST_TIMELINE`` set, a line per test as it starts and as its call ends
    (wall clock, xdist worker), where it runs: what ran beside a test that failed its
    timing. Before the first of the quiet modules' tests, the wait for a quiet box."""
    if item.nodeid.startswith(quiet.QUIET) and not quiet.WAITED:
        quiet.WAITED.append(quiet.wait())
        _timeline(f"quiet-after-{quiet.WAITED[0]:.0f}s", item.nodeid)
    _timeline("start", item.nodeid)


def pytest_runtest_teardown(item):
    _timeline("end", item.nodeid)


def _timeline(event: str, nodeid: str) -> None:
    if TIMELINE:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        with open(TIMELINE, "a") as f:
            f.write(f"{time.time():.2f} {worker} {event} {nodeid}\n")


def pytest_collection_modifyitems(config, items):
    from pipeline.device import cuda_available

    quiet.last(items)  # the tests that time a service: last, on a quiet box (tests/quiet.py)

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
from tests import quiet  # noqa: E402

RUN_ID = procs.new_run_id("pytest")
os.environ[procs.MARK] = RUN_ID
ORPHAN_WAIT_S = 30.0  # Ray's daemons end a few seconds after ray.shutdown() returns


def pytest_sessionfinish(session, exitstatus):
    quiet.note_done()
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
