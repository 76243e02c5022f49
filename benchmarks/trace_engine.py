"""What the GPU does in ``bench_models``' loops: Ferry's executor (torch engine) and the
``torch_compile`` peer on the same compiled function, each driven by its own harness
(``bench_models_harness``: 3 batches in flight, one thread), traced with torch's profiler
(CUPTI: every kernel and copy of the process, whatever API launched it).

    python benchmarks/trace_engine.py --model resnet50 --batches 1,32 --steps 200 --out t.json

Per system and batch size, from the device's own timestamps over the traced steps:
``us_per_batch`` (wall), ``gpu_busy`` (the union of kernel and copy intervals over the span
of the trace), ``kernel_us_per_batch`` / ``kernels_per_batch`` (summed kernel time and
count), ``copy_us_per_batch``, ``idle_gaps`` (the device idle gaps over 5 us: count a batch
and their total, us). Same work on the GPU and only gaps between them says the host path
(a late wake-up or a slow submit) is the difference; more kernel time says the work itself is.
A diagnostic, not a result: the profiler's own cost is in every figure.

``--spy DIR``: then, untraced, Ferry's loop runs ``--spy-s`` seconds a batch size under
py-spy (sampling this process without pausing it): where its driving thread's time goes --
prepare, commit, the wait and the finishing -- as raw stacks in ``DIR/ferry_torch_b<N>.txt``
(summarise with ``scripts/spy_top.py DIR``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import bench_models_harness as H  # noqa: E402
from benchmarks.bench_models import ModelBench  # noqa: E402
from benchmarks.profile_pipeline import py_spy  # noqa: E402

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _summary(trace: dict, steps: int, wall_s: float) -> dict:
    ev = [
        e
        for e in trace.get("traceEvents", [])
        if e.get("ph") == "X" and e.get("cat") in DEVICE_CATS and e.get("dur") is not None
    ]
    if not ev:
        return {"us_per_batch": round(1e6 * wall_s / steps, 1), "device_events": 0}
    iv = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev)
    busy, gaps, cur_s, cur_e = 0.0, [], iv[0][0], iv[0][1]
    for s, e in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = iv[-1][1] - iv[0][0]
    kern = [e for e in ev if e["cat"] == "kernel"]
    copies = [e for e in ev if e["cat"] != "kernel"]
    big = [g for g in gaps if g > 5.0]
    return {
        "us_per_batch": round(1e6 * wall_s / steps, 1),
        "gpu_busy": round(busy / span, 3) if span else None,
        "kernel_us_per_batch": round(sum(float(e["dur"]) for e in kern) / steps, 1),
        "kernels_per_batch": round(len(kern) / steps, 1),
        "copy_us_per_batch": round(sum(float(e["dur"]) for e in copies) / steps, 1),
        "idle_gaps_per_batch": round(len(big) / steps, 2),
        "idle_us_per_batch": round(sum(big) / steps, 1),
        "largest_gaps_us": [round(g, 1) for g in sorted(big)[-5:]],
    }


def trace_driver(d: H.Driver, steps: int, path: str) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(50):
        d.step()
    d.drain()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(steps):
            d.step()
        d.drain()
        wall = time.perf_counter() - t0
    torch.cuda.synchronize()
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    return _summary(trace, steps, wall)


def spy_driver(d: H.Driver, seconds: float, path: str) -> None:
    """Run ``d`` for ``seconds`` with py-spy recording this process (raw stacks to ``path``,
    every thread, not paused)."""
    proc = py_spy(os.getpid(), seconds, path, rate=500)
    t_end = time.perf_counter() + seconds + 1.0
    while time.perf_counter() < t_end and proc.poll() is None:
        for _ in range(50):
            d.step()
    d.drain()
    proc.wait(30)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default="")
    ap.add_argument("--spy", default="", help="then py-spy Ferry's loop: raw stacks in this folder")
    ap.add_argument("--spy-s", type=float, default=8.0, help="seconds spied a batch size")
    ap.add_argument(
        "--batch-wait",
        choices=("sleep", "spin"),
        default="sleep",
        help="Ferry's executor.batch_wait (spin: its batch waits as the peer's do)",
    )
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    opts = argparse.Namespace(
        onnx_models="", compute_streams=H.IN_FLIGHT, seconds=1.2, batch_wait=args.batch_wait
    )
    mb = ModelBench(args.model, batches, ["ferry_torch", "torch_compile"], opts)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        mb.build(tmp)
        ex = mb.exs["torch"]
        fn = ex.models[args.model].engine.fn["image"]
        for b in batches:
            drivers = {
                "ferry_torch": H.ferry_driver(ex, args.model, b)[0],
                "torch_compile": H.torch_driver(fn, b, True),
            }
            for system, d in drivers.items():
                row = {"model": args.model, "batch": b, "system": system}
                row.update(trace_driver(d, args.steps, os.path.join(tmp, "t.json")))
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.spy and system == "ferry_torch":
                    os.makedirs(args.spy, exist_ok=True)
                    spy_driver(d, args.spy_s, os.path.join(args.spy, f"ferry_torch_b{b}.txt"))
                d.close()
    mb.close()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
