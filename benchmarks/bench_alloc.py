"""Raw cudaMalloc/cudaFree against Ferry reservations, 12 MB blocks, 1/8/50 threads.

    python benchmarks/bench_alloc.py [--out benchmarks/results/alloc.json] [--seconds 2]

Each thread loops "get a 12 MB block, give it back" for a fixed time and records every
pair's latency, while a background stream keeps the GPU busy with matrix products (a
serving GPU is never idle, and cudaFree synchronizes the device). Both modes run in the
same process on the same device, one after the other, with the same load.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, table, today, write_json  # noqa: E402

BLOCK = 12 << 20


class Busy:
    """Matrix products on a stream of their own, for as long as the benchmark runs."""

    def __init__(self) -> None:
        import cupy

        self.stop = threading.Event()
        self.a = cupy.random.standard_normal((4096, 4096), dtype=cupy.float32).astype(cupy.float16)
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        import cupy

        s = cupy.cuda.Stream(non_blocking=True)
        with s:
            while not self.stop.is_set():
                for _ in range(4):
                    self.a @ self.a  # noqa: B018
                s.synchronize()

    def __enter__(self) -> Busy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def run_mode(mode: str, threads: int, seconds: float, pool) -> dict:
    from cupy.cuda import runtime

    lat: list[list[float]] = [[] for _ in range(threads)]
    start = threading.Barrier(threads + 1)
    stop = threading.Event()
    perf = time.perf_counter

    def raw_op() -> None:
        p = runtime.malloc(BLOCK)
        runtime.free(p)

    def ferry_op() -> None:
        pool.reserve(BLOCK).release()

    op = raw_op if mode == "raw" else ferry_op

    def worker(i: int) -> None:
        import cupy

        cupy.cuda.Device(0).use()
        for _ in range(3):  # warm: the pool's first blocks come from the driver
            op()
        start.wait()
        out = lat[i]
        while not stop.is_set():
            t0 = perf()
            op()
            out.append(perf() - t0)

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    start.wait()
    t0 = perf()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    elapsed = perf() - t0
    allv = np.concatenate([np.asarray(v) for v in lat]) * 1e6
    return {
        "threads": threads,
        "mode": mode,
        "ops_per_s": round(len(allv) / elapsed, 1),
        "p50_us": round(float(np.percentile(allv, 50)), 2),
        "p99_us": round(float(np.percentile(allv, 99)), 2),
        "ops": int(len(allv)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/results/alloc.json")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--threads", default="1,8,50")
    args = ap.parse_args()
    from pipeline.device import Backend
    from pipeline.memory.pool import CupyPool

    pool = CupyPool(Backend("cupy"), 32 << 30)
    rows = []
    with Busy():
        for n in (int(t) for t in args.threads.split(",")):
            for mode in ("raw", "ferry"):
                rows.append(run_mode(mode, n, args.seconds, pool))
                print(rows[-1], flush=True)
    for n in {r["threads"] for r in rows}:
        raw = next(r for r in rows if r["threads"] == n and r["mode"] == "raw")
        fer = next(r for r in rows if r["threads"] == n and r["mode"] == "ferry")
        fer["x_raw_ops"] = round(fer["ops_per_s"] / raw["ops_per_s"], 1)
        fer["p99_vs_raw"] = round(raw["p99_us"] / max(fer["p99_us"], 1e-9), 1)
    s = pool.stats()
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "block_bytes": BLOCK,
            "load": "a background stream running 4096^2 fp16 matrix products",
            "baseline": "raw cudaMalloc+cudaFree in the same run",
            "rows": rows,
            "ferry_pool": s.as_dict(),
        },
    )
    print(
        table(rows, ["threads", "mode", "ops_per_s", "p50_us", "p99_us", "x_raw_ops", "p99_vs_raw"])
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
