"""Summarise py-spy raw stacks (``profile_pipeline.py --spy DIR``): where each process spends
its non-idle samples, by thread, by owner within each thread (Ferry's code and what it
calls, Ray Serve's with uvicorn, FastAPI's layers, the event loop itself), by function
itself (self) and by function with what it calls (inclusive).

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
FRAME_FILE = re.compile(r"\((.*):\d+\)$")
# whose code a frame is, by its file (py-spy names a package's files from the package)
OWNERS = (
    ("ferry", re.compile(r"^(deployments|pipeline|benchmarks|loadtest)/")),
    ("ray_serve", re.compile(r"^(ray|uvicorn|httptools|grpc)/")),
    ("fastapi", re.compile(r"^(fastapi|starlette)/")),
    ("asyncio", re.compile(r"^(asyncio/|selectors\.py)")),
)


def owner_of(frames: list[str]) -> str:
    """Whose CPU a sample is: that of the frame nearest the leaf that is Ferry's or Ray
    Serve's (uvicorn included) -- a library Ferry calls (json, Starlette's request objects,
    asyncio's futures) counts as Ferry's, one Serve calls as Serve's -- except that FastAPI
    and Starlette code between the leaf and a Serve frame is ``fastapi`` (the app's own
    layers); no such frame: ``asyncio`` (its Python code), ``native`` (a thread's run()
    and nothing under it: C code -- uvloop's loop and its I/O on an event-loop thread) or
    ``other``."""
    if not frames or frames[-1].startswith("Thread.run ("):
        return "native"
    seen_fastapi = seen_asyncio = False
    for frame in reversed(frames):
        m = FRAME_FILE.search(frame)
        path = m.group(1) if m else ""
        owner = next((o for o, pattern in OWNERS if pattern.search(path)), None)
        if owner is None:
            continue
        if owner == "ferry":
            return owner
        if owner == "ray_serve":
            return "fastapi" if seen_fastapi else owner
        seen_fastapi |= owner == "fastapi"
        seen_asyncio |= owner == "asyncio"
    return "fastapi" if seen_fastapi else ("asyncio" if seen_asyncio else "other")


def frame_key(frame: str) -> str:
    """``f (path/to/mod.py:12)`` -> ``f (mod.py)``: one key per function, not per line."""
    frame = LINENO.sub(")", frame)
    name, _, where = frame.partition(" (")
    return f"{name} ({os.path.basename(where.rstrip(')'))})" if where else name


def summarise(path: str, top: int) -> str:
    threads: Counter[str] = Counter()
    owners: dict[str, Counter[str]] = {}
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
            thread = head[1] if len(head) == 2 else head[0]
            threads[thread] += n
            owners.setdefault(thread.rstrip("0123456789_-"), Counter())[owner_of(stack[1:])] += n
            frames = [frame_key(s) for s in stack[1:]] or ["<no python frame>"]
            own[frames[-1]] += n
            for k in set(frames):
                incl[k] += n
    if not total:
        return f"== {os.path.basename(path)}: no samples\n"
    pct = lambda n: f"{100 * n / total:5.1f}%"  # noqa: E731
    out = [f"== {os.path.basename(path)}: {total} samples"]
    out.append("  threads: " + ", ".join(f"{t} {pct(n)}" for t, n in threads.most_common(6)))
    out.append("  by owner (owner_of), each thread's samples:")
    for t, c in sorted(owners.items(), key=lambda kv: -sum(kv[1].values()))[:6]:
        k = sum(c.values())
        share = ", ".join(f"{o} {100 * c[o] / k:.0f}%" for o, _ in c.most_common())
        out.append(f"    {t} ({pct(k)}): {share}")
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
