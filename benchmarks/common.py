"""Shared benchmark plumbing: machine description, JSON output, a small table printer, a
run's time budget."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import time
from typing import Any


def machine() -> str:
    gpu = ""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        gpu = "; ".join(ln.strip() for ln in out.stdout.splitlines() if ln.strip())
    except (OSError, subprocess.SubprocessError):
        gpu = "no GPU"
    return f"{gpu} | {os.cpu_count()} CPU cores | {platform.processor() or platform.machine()} | Python {platform.python_version()}"


def gpu_name(described: str | None = None) -> str:
    """The device's name alone (``NVIDIA H200``) from ``machine()``'s line (or this one's):
    what rows carry where one file gathers runs of several machines."""
    return (described or machine()).split("|")[0].split(",")[0].strip() or "no GPU"


def commit() -> str:
    """HEAD's short hash; FERRY_COMMIT where the tree is a copy without .git (the GPU machine)."""
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
            timeout=20,
        )
        got = r.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        got = ""
    return os.environ.get("FERRY_COMMIT") or got or "unknown"


def read_results(path: str) -> dict[str, Any]:
    """A results file's sections (reliability.json), or none where it does not exist yet."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def write_results(path: str, doc: dict[str, Any]) -> None:
    """Write a results file that several scripts update section by section (one layout)."""
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def today() -> str:
    return _dt.date.today().isoformat()


def write_json(path: str, payload: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"
        return str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols]
    lines = [" | ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    for r in rows:
        lines.append(
            " | ".join(fmt(r.get(c, "")).rjust(w) for c, w in zip(cols, widths, strict=True))
        )
    return "\n".join(lines)


def run_no(key: str) -> int:
    """``run12`` -> 12: ``e2e.json``'s runs in their order (``max`` of the strings would put
    run9 after run10); -1 for a key of another form."""
    return int(key[3:]) if key[3:].isdigit() else -1


class Budget:
    """A run's wall-clock allowance (``--budget-s``): whether the next step still fits, so
    that a run on a lent machine ends on its own, with every measured level saved, instead
    of being killed by the call's limit in the middle of a start-up. ``None``: no limit."""

    def __init__(self, seconds: float | None, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.end = None if seconds is None else clock() + seconds

    def left(self) -> float:
        return float("inf") if self.end is None else self.end - self.clock()

    def fits(self, need_s: float) -> bool:
        return self.left() >= need_s

    def within(self, cap_s: float, reserve_s: float = 0.0) -> float:
        """How long a wait may take: ``cap_s`` at most, and no more than is left past
        ``reserve_s`` (what must still fit after it: a level, a stop); never below 0."""
        return max(0.0, min(cap_s, self.left() - reserve_s))
