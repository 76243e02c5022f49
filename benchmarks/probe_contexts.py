"""N processes, each owning the GPU with one Ferry executor, timed together: does the GPU's
throughput hold as its CUDA contexts multiply?

The question behind it (issue 28): ``ferry`` (8 replicas, each a CUDA context, on the native
cupy engine) kept 5.7k img/s on an H100 with the GPU 0.81-0.85 busy, while ``ferry_torch``
(the same 8 replicas, ResNet-50 on the torch engine) and the expert peer (8 torch.compile
replicas) stalled at 0.9-1.9k img/s with the GPU 0.96-0.99 busy. One process of either
engine runs ResNet-50 at 17-30k img/s. This times the engine alone, without Serve, HTTP or
decode: each of N processes drives its executor at ``--batch`` (three batches in flight,
from its pinned ring, as ``bench_models`` does) for the same window, started together; the
row is their summed img/s, the GPU's busy share over the window and each process's CPU
seconds per wall second (a host that spins while the GPU is slow shows here).

    python benchmarks/probe_contexts.py --engines torch,native --procs 1,8 --batch 64 --mps

Rows ``{"engine", "procs", "batch", "mps", "img_s", "per_proc_img_s", "gpu_util",
"cpu_per_proc", "captures_timed", "eager_runs_timed"}``; ``--out`` writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import commit, machine, table, today, write_json  # noqa: E402
from benchmarks.device_sampler import DeviceSampler  # noqa: E402
from benchmarks.mps import mps_server  # noqa: E402

COLS = ["engine", "procs", "batch", "mps", "img_s", "gpu_util", "cpu_per_proc", "eager_runs_timed"]


def child(engine: str, batch: int, fraction: float) -> None:
    """One process: build and warm the executor, say READY, wait for the window's length on
    stdin, drive the executor for it, print the window's facts as one JSON line."""
    from benchmarks.bench_models_harness import ferry_driver
    from pipeline.config import ExecutorConfig, ModelConfig
    from pipeline.executor import GpuExecutor

    ex = GpuExecutor(
        ExecutorConfig(
            backend="cupy", buckets=(batch,), max_in_flight=3, pool_limit_fraction=fraction
        )
    )
    ex.load_entry(ModelConfig(name="m", engine=engine, source="resnet50"))
    ex.warmup()
    drive, facts = ferry_driver(ex, "m", batch)
    for _ in range(3):
        drive.step()
    drive.drain()
    print("READY", flush=True)
    seconds = float(sys.stdin.readline())
    n, c0, t0 = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        drive.step()
        n += 1
    drive.drain()
    wall = time.perf_counter() - t0
    out = {"img_s": n * batch / wall, "cpu_per_s": (time.process_time() - c0) / wall, **facts()}
    print(json.dumps(out), flush=True)
    ex.close()


def level(engine: str, procs: int, batch: int, seconds: float, mps: bool) -> dict[str, Any]:
    """``procs`` children of ``engine`` started, warmed, then timed over one window."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child", engine, "--batch", str(batch)]
    cmd += ["--fraction", str(round(0.8 / procs, 3))]
    kids = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(procs)
    ]
    try:
        for k in kids:
            line = k.stdout.readline().strip()
            if line != "READY":
                raise RuntimeError(f"{engine} x{procs}: a process did not start ({line!r})")
        with DeviceSampler(every_s=0.1) as dev:
            for k in kids:
                k.stdin.write(f"{seconds}\n")
                k.stdin.flush()
            got = [json.loads(k.stdout.readline()) for k in kids]
    except BaseException:  # the others wait on stdin for a window that will not come
        for k in kids:
            k.kill()
        raise
    finally:
        for k in kids:
            k.wait(timeout=120)
    util = dev.result() or {}
    return {
        "engine": engine,
        "procs": procs,
        "batch": batch,
        "mps": mps,
        "img_s": round(sum(g["img_s"] for g in got)),
        "per_proc_img_s": [round(g["img_s"]) for g in got],
        "gpu_util": util.get("gpu_util"),
        "cpu_per_proc": round(sum(g["cpu_per_s"] for g in got) / procs, 2),
        "captures_timed": sum(g["captures_timed"] for g in got),
        "eager_runs_timed": sum(g["eager_runs_timed"] for g in got),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", default="torch,native")
    ap.add_argument("--procs", default="1,8")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--mps", action="store_true", help="each level also under CUDA MPS")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--fraction", type=float, default=0.4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.batch, args.fraction)
    rows = []
    for mps in (False, True) if args.mps else (False,):
        with mps_server(mps):
            for engine in args.engines.split(","):
                for n in (int(p) for p in args.procs.split(",")):
                    rows.append(level(engine, n, args.batch, args.seconds, mps))
                    print(table([rows[-1]], COLS), flush=True)
    print(table(rows, COLS))
    if args.out:
        write_json(
            args.out, {"date": today(), "commit": commit(), "machine": machine(), "rows": rows}
        )


if __name__ == "__main__":
    main()
