"""ResNet-50 fp16 throughput: Ferry's executor against its naive mode and torchvision.

    python benchmarks/bench_engine.py [--out benchmarks/results/engine.json] [--seconds 2]

* ``ferry``: host uint8 batches through the executor -- pinned staging, h2d, CUDA graph
  replay, d2h -- with up to ``max_in_flight`` batches in flight from one submitting thread.
* ``ferry_naive``: the same graph, per call cudaMalloc, synchronous pageable copies,
  eager launch, cudaFree.
* ``torch_eager`` / ``torch_graph``: torchvision resnet50, fp16, channels_last, input
  already on the GPU (so the peer does not even pay for the copy Ferry makes), eager
  and captured in a CUDA graph.

All in one process on one GPU, one after the other. Also writes where Ferry's time goes
at batch 128 (per-op device time, eager, from CUDA events between ops).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, table, today, write_json  # noqa: E402

BATCHES = (1, 8, 32, 128, 256)


def run_for(seconds: float, step, batch: int, sync=None, min_iters: int = 5) -> float:
    """img/s of calling ``step`` repeatedly for about ``seconds``."""
    for _ in range(2):
        step()
    if sync:
        sync()
    n = 0
    t0 = time.perf_counter()
    while n < min_iters or time.perf_counter() - t0 < seconds:
        step()
        n += 1
    if sync:
        sync()
    return n * batch / (time.perf_counter() - t0)


def ferry_rate(ex, batch: int, seconds: float) -> float:
    x = np.random.default_rng(batch).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
    pending = []

    def step():
        p = ex.prepare("resnet50", batch)  # waits for a staging slot when max_in_flight are out
        pending.append(ex.commit(p, x))
        while pending and pending[0].done():
            pending.pop(0).wait()

    def sync():
        while pending:
            pending.pop(0).wait()

    return run_for(seconds, step, batch, sync)


def naive_rate(ex, batch: int, seconds: float) -> float:
    x = np.random.default_rng(batch).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
    return run_for(seconds, lambda: ex.infer("resnet50", x), batch)


def torch_rates(batch: int, seconds: float) -> tuple[float, float]:
    import torch
    import torchvision

    model = (
        torchvision.models.resnet50(weights=None)
        .eval()
        .half()
        .cuda()
        .to(memory_format=torch.channels_last)
    )
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16).to(
        memory_format=torch.channels_last
    )
    with torch.no_grad():
        eager = run_for(seconds, lambda: model(x), batch, torch.cuda.synchronize)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            model(x)
        graph = run_for(seconds, g.replay, batch, torch.cuda.synchronize)
    return eager, graph


def op_profile(ex, batch: int) -> dict:
    """Device time per op type and the slowest nodes, eager, from events between ops."""
    import cupy

    plan = ex.plan("resnet50", batch)
    res = ex.pool.reserve(plan.arena_bytes)
    bound = plan.bind(res.buffer, ex.engine_of("resnet50").constants)
    stream = ex.streams.compute[0]
    bound.run(stream)
    events = [cupy.cuda.Event() for _ in range(len(bound.steps) + 1)]
    events[0].record(stream.raw)
    for i, (op, op_plan, ins, outs, ws) in enumerate(bound.steps):
        op.commit(op_plan, ins, outs, ws, stream)
        events[i + 1].record(stream.raw)
    events[-1].synchronize()
    by_op: dict[str, float] = defaultdict(float)
    nodes = []
    for i, (node, op_plan, _) in enumerate(plan.steps):
        ms = cupy.cuda.get_elapsed_time(events[i], events[i + 1])
        kind = node.op.name
        if kind == "conv2d":
            g = op_plan.detail
            kind = (
                "conv1x1"
                if g.direct
                else (
                    "conv_stem"
                    if not g.vec
                    else f"conv{g.kh}x{g.kw}" + ("_s2" if g.sh == 2 else "")
                )
            )
        by_op[kind] += ms
        nodes.append((ms, node.name, op_plan.flops))
    res.release()
    total = sum(by_op.values())
    nodes.sort(reverse=True)
    return {
        "batch": batch,
        "total_ms": round(total, 3),
        "by_op_ms": {k: round(v, 3) for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])},
        "slowest_nodes": [
            {"node": n, "ms": round(ms, 3), "tflops": round(f / (ms * 1e-3) / 1e12, 1)}
            for ms, n, f in nodes[:12]
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/results/engine.json")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    args = ap.parse_args()
    from pipeline.config import ExecutorConfig
    from pipeline.executor import GpuExecutor

    batches = tuple(int(b) for b in args.batches.split(","))
    ex = GpuExecutor(ExecutorConfig(backend="cupy", buckets=batches, max_in_flight=3))
    ex.load_model("resnet50", "resnet50", seed=0)
    t0 = time.perf_counter()
    ex.warmup()
    warm_s = time.perf_counter() - t0
    naive = GpuExecutor(ExecutorConfig(backend="cupy", buckets=batches, mode="naive"))
    naive.load_model("resnet50", "resnet50", seed=0)
    rows = []
    for b in batches:
        row = {
            "batch": b,
            "ferry_img_s": round(ferry_rate(ex, b, args.seconds), 1),
            "ferry_naive_img_s": round(naive_rate(naive, b, args.seconds / 2), 1),
        }
        te, tg = torch_rates(b, args.seconds)
        row.update(torch_eager_img_s=round(te, 1), torch_graph_img_s=round(tg, 1))
        row["vs_torch_eager"] = round(row["ferry_img_s"] / te, 3)
        row["vs_torch_graph"] = round(row["ferry_img_s"] / tg, 3)
        row["vs_naive"] = round(row["ferry_img_s"] / row["ferry_naive_img_s"], 2)
        rows.append(row)
        print(row, flush=True)
    profile = [op_profile(ex, b) for b in (32, 128) if b in batches]
    stats = ex.stats()
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "model": "resnet50 (seeded random weights), fp16, 224x224",
            "baselines": "torchvision resnet50 fp16 channels_last eager and CUDA graph, input already on the GPU; Ferry naive mode; all in this run",
            "ferry_warmup_s": round(warm_s, 2),
            "rows": rows,
            "op_profile": profile,
            "ferry_stats": {
                k: stats[k]
                for k in (
                    "batches",
                    "graph_replays",
                    "captures",
                    "max_in_flight_seen",
                    "staging_waits",
                )
            },
            "ferry_pool": stats["pool"],
        },
    )
    print(
        table(
            rows,
            [
                "batch",
                "ferry_img_s",
                "ferry_naive_img_s",
                "torch_eager_img_s",
                "torch_graph_img_s",
                "vs_torch_eager",
                "vs_torch_graph",
            ],
        )
    )
    for p in profile:
        print(p)
    ex.close()
    naive.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
