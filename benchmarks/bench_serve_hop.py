"""What one Serve call between two deployments costs, with nothing else in it: the floor
under Ferry's `hop_in` / `hop_out` (bench_e2e's breakdown).

A caller replica awaits an empty async method of a callee replica, one call at a time, with
a payload shaped like Ferry's (a list of one (bytes, content type) pair); the callee stamps
when the call arrived and when it left, so the round trip splits into the way there and the
way back, as in Ferry's breakdown. The baseline is the same call to a plain Ray actor from
the same replica (no Serve router, no Serve replica wrapper), measured in the same run.
Serve's defaults and `RAY_SERVE_THROUGHPUT_OPTIMIZED=1` each get a fresh local Ray.

    python benchmarks/bench_serve_hop.py [--calls 300] [--sizes 100,43000,430000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import machine, table, today, write_json  # noqa: E402
from loadtest.run import venv_bin  # noqa: E402

MODES = {"default": {}, "throughput_optimized": {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}}


def _stats(xs: list[float]) -> tuple[float, float]:
    s = sorted(xs)
    return round(s[len(s) // 2], 3), round(s[min(len(s) - 1, int(len(s) * 0.99))], 3)


def child(calls: int, sizes: list[int]) -> list[dict]:
    """In a fresh Ray: the caller's measurements, one row per (path, size)."""
    import ray
    from ray import serve

    @ray.remote
    class Echo:  # the baseline: a plain async Ray actor
        async def f(self, payload: list, sent: float) -> tuple[float, float]:
            return time.time() * 1e3 - sent, time.time() * 1e3

    @serve.deployment(max_ongoing_requests=64)
    class Callee:
        async def __call__(self, payload: list, sent: float) -> tuple[float, float]:
            return time.time() * 1e3 - sent, time.time() * 1e3

    @serve.deployment(max_ongoing_requests=64)
    class Caller:
        def __init__(self, callee: object) -> None:
            self.callee = callee
            self.echo = Echo.remote()

        async def __call__(self, path: str, n: int, size: int) -> dict:
            payload = [(os.urandom(size), "image/jpeg")]
            there, back, trip = [], [], []
            for _ in range(n):
                t0 = time.time() * 1e3
                if path == "serve":
                    hop_in, left = await self.callee.remote(payload, t0)
                else:
                    hop_in, left = await self.echo.f.remote(payload, t0)
                t1 = time.time() * 1e3
                there.append(hop_in)
                back.append(t1 - left)
                trip.append(t1 - t0)
            return {"hop_in": _stats(there), "hop_out": _stats(back), "round_trip": _stats(trip)}

    ray.init(include_dashboard=False, log_to_driver=False)
    handle = serve.run(Caller.bind(Callee.bind()), name="hop", route_prefix=None)

    async def measure() -> list[dict]:
        try:
            return await _measure()
        finally:  # on this loop: the handle's router may live on it (throughput mode)
            await serve.shutdown_async()

    async def _measure() -> list[dict]:
        rows = []
        for path in ("serve", "ray_actor"):
            await handle.remote(path, 30, 1000)  # warm the path
        for size in sizes:
            for path in ("serve", "ray_actor"):
                r = await handle.remote(path, calls, size)
                rows.append(
                    {
                        "path": path,
                        "payload_bytes": size,
                        "hop_in_p50_ms": r["hop_in"][0],
                        "hop_out_p50_ms": r["hop_out"][0],
                        "round_trip_p50_ms": r["round_trip"][0],
                        "round_trip_p99_ms": r["round_trip"][1],
                    }
                )
        return rows

    try:
        return asyncio.run(measure())
    finally:
        ray.shutdown()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--sizes", default="100,43000,430000")
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "serve_hop.json"))
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    if args.child:
        print("ROWS " + json.dumps(child(args.calls, sizes)), flush=True)
        return 0
    rows = []
    for mode, env in MODES.items():
        print(f"== {mode}", flush=True)
        subprocess.run([venv_bin("ray"), "stop", "--force"], capture_output=True, timeout=120)
        cmd = [sys.executable, __file__, "--child", "--calls", str(args.calls)]
        out = subprocess.run(
            cmd + ["--sizes", args.sizes],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=900,
        )
        got = [ln for ln in out.stdout.splitlines() if ln.startswith("ROWS ")]
        if not got:
            print(out.stdout[-2000:], out.stderr[-4000:], sep="\n")
            return 1
        for r in json.loads(got[-1][5:]):
            rows.append({"mode": mode, **r})
    base = {(r["mode"], r["payload_bytes"]): r for r in rows if r["path"] == "ray_actor"}
    for r in rows:
        b = base[(r["mode"], r["payload_bytes"])]
        r["vs_ray_actor"] = round(r["round_trip_p50_ms"] / b["round_trip_p50_ms"], 2)
    print(
        table(
            rows,
            [
                "mode",
                "path",
                "payload_bytes",
                "hop_in_p50_ms",
                "hop_out_p50_ms",
                "round_trip_p50_ms",
                "round_trip_p99_ms",
                "vs_ray_actor",
            ],
        )
    )
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "method": f"one call at a time, {args.calls} calls per row, from inside a Serve replica; "
            "hop_in: the caller's send to the callee's method starting, hop_out: the callee's "
            "return to the caller resuming (wall clock, one machine); vs_ray_actor: round trip "
            "over the plain Ray actor call's in the same mode and run",
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
