"""Stop what a run started, by PID, and nothing else.

Every process a run starts -- ``serve run``, the local Ray it brings up (GCS, raylet,
workers, dashboard), Serve's HAProxy, locust -- inherits its environment. A run marks that
environment with ``FERRY_RUN_ID``; whatever is left alive with that mark when the run ends is
its orphan, wherever it was re-parented. ``ray stop --force`` and ``pkill -f`` would end every
Ray and HAProxy on the machine, another user's or another test run's included.

    python -m loadtest.procs list RUN_ID     # the PIDs (and command lines) still marked
    python -m loadtest.procs stop RUN_ID     # SIGTERM them, SIGKILL what outlives a grace

Linux only (``/proc``); elsewhere nothing is found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid

MARK = "FERRY_RUN_ID"


def new_run_id(prefix: str = "run") -> str:
    """A fresh id, nested under the id this process runs with (``outer.inner``): the outer
    run still finds, and stops, what the inner one left."""
    here = f"{prefix}-{uuid.uuid4().hex[:12]}"
    outer = os.environ.get(MARK)
    return f"{outer}.{here}" if outer else here


def _ancestors() -> set[int]:
    """This process and its ancestors: a stop never ends the one who asked for it."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return out


def _descendants() -> set[int]:
    """The live processes below this one: they end with it (torch's compile workers, the
    Ray a driver started), so they are not orphans yet."""
    children: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(p))
    out, todo = set(), [os.getpid()]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def orphans(run_id: str) -> dict[int, str]:
    """``marked`` less this process's descendants: what would outlive it."""
    below = _descendants()
    return {pid: cmd for pid, cmd in marked(run_id).items() if pid not in below}


def marked(run_id: str) -> dict[int, str]:
    """The live processes whose environment carries ``FERRY_RUN_ID=run_id`` (or a run nested
    in it, ``run_id.*``): pid -> command line (zombies, this process and its ancestors
    excluded)."""
    needle = f"{MARK}={run_id}".encode()
    mine, out = _ancestors(), {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid in mine:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if not _carries(f.read(), needle):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out[pid] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, IndexError):
            continue  # gone, or not ours to read
    return out


def _carries(environ: bytes, needle: bytes) -> bool:
    return any(var == needle or var.startswith(needle + b".") for var in environ.split(b"\x00"))


def stop(run_id: str, grace_s: float = 10.0) -> dict[int, str]:
    """SIGTERM every process marked ``run_id``, SIGKILL those alive after ``grace_s``; the
    processes that had to be stopped (empty when the run had ended cleanly)."""
    found = marked(run_id)
    for pid in found:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and marked(run_id):
        time.sleep(0.2)
    for pid in marked(run_id):
        _signal(pid, signal.SIGKILL)
    return found


def wait_gone(run_id: str, timeout_s: float) -> dict[int, str]:
    """Wait up to ``timeout_s`` for the marked processes that are not this one's
    descendants (``orphans``) to end by themselves; those left."""
    deadline = time.monotonic() + timeout_s
    left = orphans(run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = orphans(run_id)
    return left


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("list", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    found = marked(argv[1]) if argv[0] == "list" else stop(argv[1])
    for pid, cmd in sorted(found.items()):
        print(pid, cmd[:200])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
