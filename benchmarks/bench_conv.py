"""conv2d per ResNet-50 layer shape: Ferry (im2col kernel / 1x1 GEMM + cuBLAS + fused
epilogue) against cuDNN (``torch.nn.functional.conv2d``, channels_last fp16, with bias).

    python benchmarks/bench_conv.py [--out benchmarks/results/conv.json] [--batches 32,128]

Both sides are captured in CUDA graphs of 20 calls and timed by replaying the graph
between CUDA events (median of 5), so launch overhead is out of both numbers and what is
compared is device time. ``vs_cudnn`` = cuDNN time / Ferry time (1.0 = as fast).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, table, today, write_json  # noqa: E402

REPS = 20


def conv_shapes(batch: int):
    """Unique conv geometries of ResNet-50 at 224x224, with the first layer name using them."""
    from pipeline.models import resnet50

    g = resnet50.build(resnet50.random_state_dict(0))
    plan = g.prepare(batch, "float16", "cuda")
    seen = {}
    for node, op_plan, _ in plan.steps:
        if node.op.name != "conv2d":
            continue
        geo = op_plan.detail
        key = (geo.h, geo.w, geo.c, geo.cout, geo.kh, geo.sh, geo.ph)
        if key in seen:
            seen[key]["count"] += 1
            continue
        seen[key] = {"layer": node.name, "count": 1, "geo": geo, "plan": op_plan}
    return list(seen.values())


def time_graph(launch, stream_ptr_event) -> float:
    """Median microseconds per call of a graph of REPS calls."""
    import cupy

    times = []
    for _ in range(5):
        a, b = cupy.cuda.Event(), cupy.cuda.Event()
        a.record(stream_ptr_event)
        launch()
        b.record(stream_ptr_event)
        b.synchronize()
        times.append(cupy.cuda.get_elapsed_time(a, b) * 1e3 / REPS)
    return float(np.median(times))


def bench_ferry(entry) -> float:
    import cupy

    from pipeline.device import Backend, Stream
    from pipeline.ops import CONV2D

    geo, plan = entry["geo"], entry["plan"]
    rng = cupy.random.default_rng(0)
    x = rng.standard_normal((geo.n, geo.h, geo.w, geo.c), dtype=cupy.float32).astype(cupy.float16)
    w = (rng.standard_normal((geo.kp, geo.cout), dtype=cupy.float32) * 0.05).astype(cupy.float16)
    b = cupy.zeros(geo.cout, dtype=cupy.float32)
    out = cupy.empty(plan.outputs[0].shape, dtype=cupy.float16)
    ws = cupy.empty(max(plan.workspace_bytes, 1), dtype=cupy.uint8)
    stream = Stream("bench", Backend("cupy"))
    for _ in range(3):
        CONV2D.commit(plan, (x, w, b), (out,), ws, stream)
    stream.raw.begin_capture()
    for _ in range(REPS):
        CONV2D.commit(plan, (x, w, b), (out,), ws, stream)
    graph = stream.raw.end_capture()
    graph.launch(stream.raw)
    stream.synchronize()
    us = time_graph(lambda: graph.launch(stream.raw), stream.raw)
    stream.close()
    return us


def bench_torch(entry) -> float:
    import torch
    import torch.nn.functional as F

    geo = entry["geo"]
    x = torch.randn(geo.n, geo.c, geo.h, geo.w, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    w = (
        torch.randn(geo.cout, geo.c, geo.kh, geo.kw, device="cuda", dtype=torch.float16) * 0.05
    ).to(memory_format=torch.channels_last)
    b = torch.zeros(geo.cout, device="cuda", dtype=torch.float16)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            F.conv2d(x, w, b, stride=geo.sh, padding=geo.ph)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            y = F.conv2d(x, w, b, stride=geo.sh, padding=geo.ph)
    cur = torch.cuda.current_stream()  # replay() launches here; time it here
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(cur)
        g.replay()
        e.record(cur)
        e.synchronize()
        times.append(a.elapsed_time(e) * 1e3 / REPS)
    del y
    return float(np.median(times))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/results/conv.json")
    ap.add_argument("--batches", default="32,128")
    args = ap.parse_args()
    import torch

    torch.backends.cudnn.benchmark = True
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for e in conv_shapes(batch):
            g = e["geo"]
            f_us, t_us = bench_ferry(e), bench_torch(e)
            path = "gemm" if g.direct else ("im2col_vec" if g.vec else "im2col_gather")
            rows.append(
                {
                    "batch": batch,
                    "layer": e["layer"],
                    "uses": e["count"],
                    "shape": f"{g.h}x{g.w}x{g.c}->{g.cout} k{g.kh} s{g.sh}",
                    "path": path,
                    "ferry_us": round(f_us, 1),
                    "cudnn_us": round(t_us, 1),
                    "vs_cudnn": round(t_us / f_us, 3),
                    "ferry_tflops": round(2 * g.m * g.cout * g.k / (f_us * 1e-6) / 1e12, 1),
                }
            )
            print(rows[-1], flush=True)
    summary = {}
    for batch in {r["batch"] for r in rows}:
        rs = [r for r in rows if r["batch"] == batch]
        fer = sum(r["ferry_us"] * r["uses"] for r in rs)
        cud = sum(r["cudnn_us"] * r["uses"] for r in rs)
        summary[str(batch)] = {
            "all_convs_ferry_us": round(fer, 1),
            "all_convs_cudnn_us": round(cud, 1),
            "vs_cudnn": round(cud / fer, 3),
        }
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "baseline": "cuDNN via torch F.conv2d, channels_last fp16, same run",
            "method": f"CUDA graphs of {REPS} calls, event timing, median of 5",
            "rows": rows,
            "whole_network": summary,
        },
    )
    print(
        table(
            rows,
            ["batch", "layer", "shape", "path", "ferry_us", "cudnn_us", "vs_cudnn", "ferry_tflops"],
        )
    )
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
