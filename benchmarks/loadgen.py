"""A closed-loop HTTP load generator: N clients over P processes, aiohttp, images cycled.

    python benchmarks/loadgen.py --url http://127.0.0.1:8000/v1/models/resnet50/classify \
        --image chelsea.jpg [--image more.jpg ...] --clients 64 --seconds 30 [--procs 4] [--warmup 3]

Each client sends a request, waits for the answer, sends the next; with several images each
client cycles through all of them, starting at its own (clients hold different images at
any moment). It reports img/s
(answers per second), p50/p99 latency, errors by status, and the generator's own CPU use
(user+system seconds per wall second, per process), so it can be shown not to be the
bottleneck. Run it as its own process: it imports nothing of Ray.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np


async def _clients(
    url: str,
    bodies: Sequence[bytes],
    headers: dict[str, str],
    n: int,
    seconds: float,
    warmup: float,
    timings: dict[str, float] | None = None,
    first: int = 0,
) -> tuple[list[float], dict[str, int], int]:
    import aiohttp

    lat: list[float] = []
    errors: dict[str, int] = {}
    count_from = time.perf_counter() + warmup
    stop_at = count_from + seconds
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:

        async def client(i: int) -> None:
            while True:
                t0 = time.perf_counter()
                if t0 >= stop_at:
                    return
                body = bodies[i % len(bodies)]
                i += 1
                try:
                    async with s.post(url, data=body, headers=headers) as r:
                        payload = await r.read()
                        status = r.status
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    status = type(exc).__name__
                t1 = time.perf_counter()
                if t0 >= count_from and t1 <= stop_at:
                    if status == 200:
                        lat.append(t1 - t0)
                        if timings is not None:  # Ferry's per-stage timings, summed
                            for k, v in json.loads(payload).get("timings_ms", {}).items():
                                timings[k] = timings.get(k, 0.0) + v
                            timings["_n"] = timings.get("_n", 0) + 1
                    else:
                        errors[str(status)] = errors.get(str(status), 0) + 1

        await asyncio.gather(*(client(first + c) for c in range(n)))
    return lat, errors, n


def _proc(args: tuple, q: Any) -> None:
    url, bodies, headers, n, seconds, warmup, collect, first = args
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    timings: dict[str, float] | None = {} if collect else None
    lat, errors, _ = asyncio.run(_clients(url, bodies, headers, n, seconds, warmup, timings, first))
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    q.put((lat, errors, cpu / wall, timings))


def run(
    url: str,
    body: bytes | Sequence[bytes],
    content_type: str,
    clients: int,
    seconds: float,
    procs: int | None = None,
    warmup: float = 2.0,
    extra_headers: dict[str, str] | None = None,
    collect_timings: bool = False,
) -> dict[str, Any]:
    """``clients`` closed-loop clients for ``seconds`` after ``warmup``; ``body`` is one
    request body or several, cycled."""
    bodies = (body,) if isinstance(body, bytes) else tuple(body)
    procs = procs or max(1, min(clients // 32 + 1, os.cpu_count() or 1, 8))
    procs = min(procs, clients)
    headers = {"content-type": content_type, **(extra_headers or {})}
    shares = [clients // procs + (1 if i < clients % procs else 0) for i in range(procs)]
    firsts = [sum(shares[:i]) for i in range(procs)]  # client c starts at image c
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [
        ctx.Process(
            target=_proc,
            args=((url, bodies, headers, n, seconds, warmup, collect_timings, first), q),
        )
        for n, first in zip(shares, firsts, strict=True)
    ]
    for p in ps:
        p.start()
    out = []
    for _ in ps:  # a generator process that died must not hang the benchmark
        try:
            out.append(q.get(timeout=seconds + warmup + 180))
        except Exception:
            break
    for p in ps:
        p.join(10)
        if p.is_alive():
            p.kill()
    if len(out) < len(ps):
        raise RuntimeError(f"{len(ps) - len(out)} load generator process(es) gave no result")
    lat = np.concatenate([np.asarray(o[0]) for o in out]) if out else np.zeros(0)
    errors: dict[str, int] = {}
    for o in out:
        for k, v in o[1].items():
            errors[k] = errors.get(k, 0) + v
    cpu = [round(o[2], 2) for o in out]
    stage: dict[str, float] = {}
    for o in out:
        for k, v in (o[3] or {}).items():
            stage[k] = stage.get(k, 0.0) + v
    res = {
        "clients": clients,
        "seconds": seconds,
        "ok": int(len(lat)),
        "img_s": round(len(lat) / seconds, 1),
        "p50_ms": round(float(np.percentile(lat, 50)) * 1e3, 2) if len(lat) else None,
        "p99_ms": round(float(np.percentile(lat, 99)) * 1e3, 2) if len(lat) else None,
        "errors": int(sum(errors.values())),
        "errors_by_status": errors,
        "loadgen_procs": procs,
        "loadgen_cpu_per_proc": cpu,
    }
    if collect_timings and stage.get("_n"):
        n = stage.pop("_n")
        res["mean_timings_ms"] = {k: round(v / n, 3) for k, v in stage.items()}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", required=True)
    ap.add_argument("--image", required=True, action="append", help="repeat to cycle several")
    ap.add_argument("--content-type", default="image/jpeg")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--procs", type=int, default=None)
    args = ap.parse_args()
    bodies = []
    for path in args.image:
        with open(path, "rb") as f:
            bodies.append(f.read())
    res = run(
        args.url, bodies, args.content_type, args.clients, args.seconds, args.procs, args.warmup
    )
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
