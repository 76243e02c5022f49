"""A quiet box for the integration tests that time a service on two cores: they run last on
the integration worker, and first wait for every other pytest-xdist worker to have finished
its tests.

Why: the clean-clone CI's timing tests failed where another worker's tests ran beside them --
a lost node's recovery (test_placement_cluster: requests of 2 s, one shed by the queue
budget) and 1,000 stalled uploads (test_slow_clients: the probe's classify 2-5 s) -- and
passed where they ran alone (CI at 693acdc: the other worker done 3 minutes before). (The
stall test failed alone too, later, on a slower box: its own rate was the cause there, and
is lowered.) Renicing the other worker instead (62e6d32) slowed it so that its ONNX tests
ran beside the stall test, which then failed worse.

Each worker notes in a file when it has no test left (``note_done``, from
``pytest_sessionfinish``); ``wait`` polls for the other workers' notes, at most ``WAIT_S``
(past that the test runs anyway and its own bounds decide)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time

WAIT_S = 300.0
QUIET = ("tests/integration/test_placement_cluster.py", "tests/integration/test_slow_clients.py")
"""The modules that want the box to themselves."""
WAITED: list[float] = []  # the seconds this worker waited, once it has


def _note(worker: str) -> str | None:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # one id for every worker of a run
    return os.path.join(tempfile.gettempdir(), f"ferry-pytest-{run}-{worker}.done") if run else None


def note_done() -> None:
    """This worker has run its last test; the last worker to note it removes every note
    (no test waits any more)."""
    me = os.environ.get("PYTEST_XDIST_WORKER")
    path = _note(me or "")
    if not (me and path):
        return
    with open(path, "w") as f:
        f.write(f"{time.time()}\n")
    notes = _notes()
    if all(os.path.exists(p) for p in notes):
        for p in notes:
            with contextlib.suppress(FileNotFoundError):
                os.remove(p)


def _notes() -> list[str]:
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return [p for i in range(n) if (p := _note(f"gw{i}"))]


def wait() -> float:
    """Seconds waited until every other worker had noted its last test (0 outside xdist)."""
    me = os.environ.get("PYTEST_XDIST_WORKER")
    if me is None:
        return 0.0
    others = [p for p in _notes() if p != _note(me)]
    t0 = time.time()
    while time.time() - t0 < WAIT_S and not all(os.path.exists(p) for p in others):
        time.sleep(1.0)
    return time.time() - t0


def last(items: list) -> None:
    """Move the quiet modules' tests to the end, in their order (a stable sort)."""
    items.sort(key=lambda it: it.nodeid.startswith(QUIET))
