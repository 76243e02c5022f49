"""The machine's busy CPU cores over a span: what a load level cost the whole node."""

from __future__ import annotations

import os
import time
from typing import Any


def busy_cores_since(start: Any | None = None) -> tuple[Any, float]:
    """The machine's busy CPU cores (all processes: load generator, proxy, replicas) since
    ``start`` (``None`` starts the clock): ``(mark, cores)``. Tells whether a level was held
    back by the node's cores rather than by one process."""
    import psutil

    t = psutil.cpu_times()._asdict()
    for k in ("guest", "guest_nice"):  # already counted in user and nice
        t.pop(k, None)
    mark = (time.monotonic(), t["idle"] + t.get("iowait", 0.0), sum(t.values()))
    if start is None:
        return mark, 0.0
    wall = mark[0] - start[0]
    idle = mark[1] - start[1]
    total = mark[2] - start[2]
    return mark, round((total - idle) / max(wall, 1e-9), 2)


def run_cpu_s(run_id: str) -> float:
    """CPU seconds (user + system, with their reaped children's) so far of every process of
    the run ``run_id`` (``loadtest.procs``): a ``serve run``'s Ray, Serve, HAProxy and
    replicas, and nothing of the load generator, which runs outside it."""
    from loadtest import procs

    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in procs.marked(run_id):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone since it was listed
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / tick
