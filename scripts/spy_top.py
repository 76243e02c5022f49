"""Summarise py-spy raw stacks (``profile_pipeline.py --spy DIR``): where each process spends
its non-idle samples, by thread, by function itself (self) and by function with what it calls
(inclusive).

    python scripts/spy_top.py DIR [--top 25] [--match Inference]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

LINE = re.compile(r"^(.*) (\d+)$")
LINENO = re.compile(r":\d+\)$")


def frame_key(frame: str) -> str:
    """``f (path/to/mod.py:12)`` -> ``f (mod.py)``: one key per function, not per line."""
    frame = LINENO.sub(")", frame)
    name, _, where = frame.partition(" (")
    return f"{name} ({os.path.basename(where.rstrip(')'))})" if where else name


def summarise(path: str, top: int) -> str:
    threads: Counter[str] = Counter()
    own: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            m = LINE.match(line.rstrip("\n"))
            if not m:
                continue
            stack, n = m.group(1).split(";"), int(m.group(2))
            total += n
            head = stack[0].split(": ", 1)
            threads[head[1] if len(head) == 2 else head[0]] += n
            frames = [frame_key(s) for s in stack[1:]] or ["<no python frame>"]
            own[frames[-1]] += n
            for k in set(frames):
                incl[k] += n
    if not total:
        return f"== {os.path.basename(path)}: no samples\n"
    pct = lambda n: f"{100 * n / total:5.1f}%"  # noqa: E731
    out = [f"== {os.path.basename(path)}: {total} samples"]
    out.append("  threads: " + ", ".join(f"{t} {pct(n)}" for t, n in threads.most_common(6)))
    out.append("  self:")
    out += [f"    {pct(n)}  {k}" for k, n in own.most_common(top)]
    out.append("  inclusive:")
    out += [f"    {pct(n)}  {k}" for k, n in incl.most_common(top)]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("folder")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--match", default="", help="only files whose name contains this")
    args = ap.parse_args()
    for name in sorted(os.listdir(args.folder)):
        if name.endswith(".txt") and args.match in name:
            sys.stdout.write(summarise(os.path.join(args.folder, name), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
