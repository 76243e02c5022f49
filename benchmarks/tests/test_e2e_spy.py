"""``bench_e2e.py --spy``: py-spy on a system's replicas over the level asked for, and only
that one (``e2e_level._spies``, ``profile_pipeline.start_spies``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from benchmarks.bench_e2e import parse_args
from benchmarks.e2e_level import _spies
from benchmarks.profile_pipeline import start_spies
from loadtest.corpus import chelsea


def test_spy_is_off_unless_asked_and_samples_only_its_level(tmp_path):
    args = parse_args(["--systems", "ferry"])
    assert args.spy is None and args.spy_clients == 256 and not args.spy_native
    c = chelsea()
    assert _spies("ferry", c, 256, args, "run-x") == []  # not asked
    args = parse_args(["--systems", "ferry", "--spy", str(tmp_path), "--spy-clients", "64"])
    assert _spies("ferry", c, 256, args, "run-x") == []  # another level
    # the level asked for, but no process of that run: nothing to sample, no error
    assert _spies("ferry", c, 64, args, "no-such-run") == []


def _py_spy() -> str | None:
    return shutil.which("py-spy") or (
        p if os.path.exists(p := os.path.join(os.path.dirname(sys.executable), "py-spy")) else None
    )


@pytest.mark.skipif(_py_spy() is None, reason="py-spy is not installed")
@pytest.mark.parametrize("native", [False, True])
def test_a_spy_writes_a_replicas_stacks_under_its_levels_name(tmp_path, native):
    """On a real process standing in for a replica (its stacks by thread, C frames with
    ``native``), in a file named by system, corpus and level."""
    code = textwrap.dedent(
        """
        import threading, time
        def busy_loop_of_the_test():
            t = time.time()
            while time.time() - t < 20:
                pass
        threading.Thread(target=busy_loop_of_the_test, daemon=True).start()
        busy_loop_of_the_test()
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        spies = start_spies(
            {child.pid: "ServeReplica:ferry:Ingress", 1: "raylet"},  # (not a replica: skipped)
            str(tmp_path), 2, native=native, prefix="ferry_chelsea_256_",
        )  # fmt: skip
        assert len(spies) == 1
        assert spies[0].wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
    (name,) = os.listdir(tmp_path)
    assert name == f"ferry_chelsea_256_ServeReplica_ferry_Ingress_{child.pid}.txt"
    text = (tmp_path / name).read_text()
    assert "busy_loop_of_the_test" in text
    assert ("(libc" in text or "(libpython" in text) == native  # C frames only when native


def test_a_spy_that_fails_is_named_and_one_that_hangs_is_killed(capsys):
    from benchmarks.e2e_level import _spied

    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    hung = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    _spied([failed, hung], span=-59.0)  # (a second past the level: the hung one is killed)
    assert failed.returncode == 3 and hung.returncode is not None and hung.returncode < 0
    out = capsys.readouterr().out
    assert "exited 3" in out and f"exited {hung.returncode}" in out
