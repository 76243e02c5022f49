"""The machine's busy CPU cores over a span: what a load level cost the whole node."""

from __future__ import annotations

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
