"""What every part of RESULTS.md's writer shares: where the results are, reading one, a
markdown table and a result's hand-written notes."""

from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.path.join(HERE, "results")


def load(name: str) -> dict | None:
    p = os.path.join(RES, name)
    return json.load(open(p)) if os.path.exists(p) else None


def md_table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, k in cols:
            v = r.get(k, "")
            if isinstance(v, float):
                cells.append(f"{v:,.1f}" if abs(v) >= 10 or v == 0 else f"{v:.3g}")
            else:
                cells.append(str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def notes_of(stem: str) -> list[str]:
    """``["", text]`` of results/{stem}_notes.md, to follow a section's tables; ``[]`` without one."""
    path = os.path.join(RES, f"{stem}_notes.md")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return ["", f.read().strip()]
