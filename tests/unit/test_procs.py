"""loadtest.procs: a run's processes found by the id in their environment and stopped by PID,
an orphan re-parented to init included, and nothing of another run touched."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from loadtest import procs

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")

# a child that starts a sleeping grandchild and exits at once: the grandchild is an orphan
ORPHAN = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
    "print(p.pid, flush=True)"
)


def _spawn_orphan(run_id: str) -> int:
    env = {**os.environ, procs.MARK: run_id}
    out = subprocess.run(
        [sys.executable, "-c", ORPHAN], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_an_orphan_is_found_by_its_run_id_and_stopped_and_another_run_is_left_alone():
    mine, other = procs.new_run_id("t"), procs.new_run_id("t")
    orphan, bystander = _spawn_orphan(mine), _spawn_orphan(other)
    try:
        assert set(procs.marked(mine)) == {orphan}
        assert "time.sleep(120)" in procs.marked(mine)[orphan]
        assert procs.stop(mine, grace_s=5).keys() == {orphan}
        for _ in range(50):  # the kernel reaps it once its new parent waits
            if not _alive(orphan):
                break
            time.sleep(0.1)
        assert not _alive(orphan) and procs.marked(mine) == {}
        assert _alive(bystander) and set(procs.marked(other)) == {bystander}
    finally:
        procs.stop(other, grace_s=5)
    assert procs.marked(other) == {}


def test_a_nested_run_is_found_under_its_outer_id(monkeypatch):
    outer = procs.new_run_id("outer")
    monkeypatch.setenv(procs.MARK, outer)
    inner = procs.new_run_id("inner")
    assert inner.startswith(outer + ".")
    pid = _spawn_orphan(inner)
    try:
        assert set(procs.marked(outer)) == {pid}  # the outer run sees what the inner left
        assert procs.marked(outer + "x") == {}  # a prefix of the id is not the id
    finally:
        procs.stop(outer, grace_s=5)
    assert procs.marked(inner) == {}


def test_the_asking_process_is_never_its_own_orphan():
    assert os.getpid() not in procs.marked(os.environ[procs.MARK])


def test_a_runs_cpu_is_the_cpu_of_its_processes_only():
    from loadtest.cores import run_cpu_s

    mine, other = procs.new_run_id("cpu"), procs.new_run_id("cpu")
    # 0.6 s: /proc counts whole clock ticks, so exactly 0.5 s could read 0.49
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin], env={**os.environ, procs.MARK: mine})
    idle = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, procs.MARK: other}
    )
    try:
        busy.wait(60)
        assert run_cpu_s(mine) == 0.0  # it has ended: nothing of it is alive to count
        busy = subprocess.Popen(
            [sys.executable, "-c", spin + "\ntime.sleep(30)"], env={**os.environ, procs.MARK: mine}
        )
        for _ in range(600):  # until its half second of CPU is spent (however slow the box)
            if run_cpu_s(mine) >= 0.5:
                break
            time.sleep(0.05)
        assert run_cpu_s(mine) >= 0.5
        assert run_cpu_s(other) < 0.5  # the sleeper: an interpreter's start-up at most
    finally:
        procs.stop(mine, grace_s=5)
        procs.stop(other, grace_s=5)
        busy.wait(10)
        idle.wait(10)


def test_a_child_that_ends_with_this_process_is_not_an_orphan(monkeypatch):
    run_id = procs.new_run_id("kids")
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"],
        env={**os.environ, procs.MARK: run_id},
    )
    orphan = _spawn_orphan(run_id)
    try:
        assert set(procs.marked(run_id)) == {child.pid, orphan}
        assert set(procs.orphans(run_id)) == {orphan}  # re-parented: it would outlive us
    finally:
        procs.stop(run_id, grace_s=5)
        child.wait(10)


@contextlib.contextmanager
def _child(prefix: str, script: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """A Python child running ``script``, marked as a run of its own; stopped at the end."""
    run = procs.new_run_id(prefix)
    proc = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, procs.MARK: run}, stderr=subprocess.PIPE
    )
    try:
        yield run, proc
    finally:
        procs.stop(run, grace_s=5)
        proc.wait(10)


def _until(read: Callable[[], dict], done: Callable[[dict], bool], proc: subprocess.Popen) -> dict:
    """``read()`` again until ``done`` says its reading is complete (however slow the box:
    up to a minute), the child still alive."""
    got: dict = {}
    for _ in range(1200):
        got = read()
        if done(got) or proc.poll() is not None:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    return got


def _named_thread(name: str, work: str) -> str:
    """A child's script: a thread named ``name`` in the OS (as Ferry's pools name theirs)
    runs ``work`` (lines indented by four), then it and the main thread sleep on, alive, so
    what the thread spent can still be read."""
    return (
        "import ctypes, threading, time\n"
        "def work():\n"
        f"    assert ctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0) == 0  # PR_SET_NAME\n"
        f"    {work}\n"
        "    time.sleep(60)\n"
        "threading.Thread(target=work, daemon=True).start()\n"
        "time.sleep(60)"
    )


def test_a_runs_cpu_by_thread_names_the_thread_that_spent_it():
    from loadtest.cores import busiest, thread_cpu_s

    # a named OS thread (as Ferry's pools name theirs) spins for half a second of CPU, then
    # sleeps (alive, so its CPU can still be read)
    spin = _named_thread(
        "spinner", "t = time.thread_time()\n    while time.thread_time() - t < 0.5: pass"
    )
    with _child("threads", spin) as (run, proc):
        # (/proc counts whole clock ticks: 0.5 s of CPU may read 0.49)
        spun = lambda got: sum(v for (_, t), v in got.items() if t == "spinner") >= 0.4  # noqa: E731
        after = _until(lambda: thread_cpu_s(run), spun, proc)
        top = busiest({}, after, wall_s=1.0)  # everything since the child started
        assert top and top[0]["thread"] == "spinner", (top, after)
        assert top[0]["process"] == os.path.basename(sys.executable)


def test_the_main_thread_and_threads_without_a_name_are_told_apart():
    from loadtest.cores import thread_cpu_s

    # the main thread spins 0.4 s of CPU, then a thread without a name of its own (as a
    # native library's workers: it carries the process's name) spins 0.4 s
    spin = (
        "import threading, time\n"
        "def burn():\n"
        "    t = time.thread_time()\n"
        "    while time.thread_time() - t < 0.4: pass\n"
        "burn()\n"
        "threading.Thread(target=lambda: (burn(), time.sleep(60)), daemon=True).start()\n"
        "time.sleep(60)"
    )
    with _child("threads", spin) as (run, proc):
        both = lambda by: by.get("main", 0) >= 0.3 and by.get("unnamed", 0) >= 0.3  # noqa: E731
        by = _until(lambda: {t: v for (_, t), v in thread_cpu_s(run).items()}, both, proc)
        assert both(by), by


def test_a_runs_switches_by_thread_name_the_thread_that_slept_and_woke():
    from loadtest.cores import busiest, thread_switches

    # a named thread sleeps and wakes 400 times (a hand-off's cost: each is a context
    # switch), then sleeps on; the main thread sleeps once
    hops = _named_thread("hopper", "for _ in range(400): time.sleep(0.0005)")
    with _child("switches", hops) as (run, proc):
        woke = lambda got: sum(v for (_, t), v in got.items() if t == "hopper") >= 400  # noqa: E731
        after = _until(lambda: thread_switches(run), woke, proc)
        top = busiest({}, after, wall_s=2.0, unit="switches_per_s")
        assert top and top[0]["thread"] == "hopper", (top, after)
        assert top[0]["switches_per_s"] >= 200  # 400 or more over the 2 s given
