"""Where the expert peer's batch spends its time, on one GPU, without Serve (issue 28: profile
``rayserve_expert``). For each corpus and batch size, ``ExpertCore`` (the peer replica's
work: ``benchmarks/peers/rayserve_expert.py``) runs its batches two ways:

* **phases**: each phase of a batch followed by a device sync, so each one's wall time is
  its own: ``decode`` (the decoder's call, its own syncs included), ``fill`` (resize, crop
  and normalise into the bucket's input), ``model`` (the CUDA graph, softmax and top 5) and
  ``answer`` (the copy to the host and the JSON-ready rows). The medians of ``--batches-n``
  batches, and the CPU time of the process over them.
* **kernels**: ``torch.profiler`` over as many batches run as the replica runs them (no
  sync but the answer's), the device time of the busiest kernels and copies, summed, per
  image.

    python benchmarks/profile_peer.py [--corpus chelsea,photos] [--batches 8,32,128]
        [--decoder torchvision] [--no-compile] [--out /tmp/out/peer_profile.json]

Needs CUDA, torch and torchvision (the GPU machine); compiling takes a minute or two per
bucket set (``--no-compile``: the model eager).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, today, write_json  # noqa: E402
from loadtest.corpus import corpus  # noqa: E402

PHASES = ("decode", "fill", "model", "answer")


def phases(core, bodies: list[bytes], n: int) -> dict:
    """The median ms of each phase over ``n`` batches of ``bodies``, each phase synced."""
    from benchmarks.peers.rayserve_expert import Pending, bucket_of

    torch = core.torch
    sync = torch.cuda.synchronize
    took: dict[str, list[float]] = {p: [] for p in PHASES}
    c0 = time.process_time()
    for _ in range(n):
        t = [time.perf_counter()]
        images = core._decode(bodies)
        sync()
        t.append(time.perf_counter())
        bucket = bucket_of(len(bodies), core.buckets)
        order = core._fill(images, core.inputs[bucket])
        sync()
        t.append(time.perf_counter())
        packed = core.top_k(core._run(bucket)[: len(order)])
        sync()
        t.append(time.perf_counter())
        core.finish(Pending(len(bodies), order, packed.cpu()))
        t.append(time.perf_counter())
        for p, a, b in zip(PHASES, t, t[1:], strict=False):
            took[p].append((b - a) * 1e3)
    cpu = (time.process_time() - c0) * 1e3 / (n * len(bodies))
    out = {f"{p}_ms": round(statistics.median(v), 3) for p, v in took.items()}
    total = sum(out.values())
    out["batch_ms"] = round(total, 3)
    out["img_s_synced"] = round(len(bodies) / total * 1e3, 1)
    out["cpu_ms_per_img"] = round(cpu, 4)
    return out


def kernels(core, bodies: list[bytes], n: int, top: int) -> dict:
    """The device time a batch's kernels and copies take, per image, as the replica runs
    its batches (one sync, the answer's): the ``top`` busiest by name."""
    from torch.profiler import ProfilerActivity, profile

    core.classify(bodies)
    core.torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            core.classify(bodies)
        core.torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    images = n * len(bodies)
    events = [e for e in prof.key_averages() if _device_us(e) > 0]
    events.sort(key=_device_us, reverse=True)
    device_us = sum(_device_us(e) for e in events if not e.key.startswith("cuda"))
    return {
        "img_s_unsynced": round(images / wall, 1),
        "device_us_per_img": round(device_us / images, 2),
        "top": [
            {"name": e.key[:120], "us_per_img": round(_device_us(e) / images, 2), "calls": e.count}
            for e in events[:top]
        ],
    }


def _device_us(e) -> float:
    """An event's own device time in microseconds (the attribute's name moved in torch 2.4)."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(e, name, None)
        if v:
            return float(v)
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default="chelsea,photos")
    ap.add_argument("--batches", default="8,32,128", help="images a batch, comma-separated")
    ap.add_argument("--decoder", default="torchvision", help="torchvision or nvimgcodec")
    ap.add_argument("--no-compile", action="store_true", help="the model eager")
    ap.add_argument("--batches-n", type=int, default=20, help="batches a measurement")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--out", default="/tmp/out/peer_profile.json")
    args = ap.parse_args()
    from benchmarks.peers.rayserve_expert import ExpertCore, sleep_on_sync

    sleep_on_sync()  # as the peer's replica does, before CUDA starts
    t0 = time.perf_counter()
    core = ExpertCore(compile=not args.no_compile, decoder=args.decoder)
    start_s = time.perf_counter() - t0
    rows = []
    for name in [c for c in args.corpus.split(",") if c]:
        c = corpus(name)
        for b in [int(x) for x in args.batches.split(",") if x]:
            bodies = [c.bodies[i % len(c.bodies)] for i in range(b)]
            row = {"corpus": name, "batch": b, **phases(core, bodies, args.batches_n)}
            row.update(kernels(core, bodies, args.batches_n, args.top))
            rows.append(row)
            print(
                f"{name} x{b}: "
                + ", ".join(f"{p} {row[p + '_ms']} ms" for p in PHASES)
                + f"; synced {row['img_s_synced']} img/s, unsynced {row['img_s_unsynced']}, "
                f"device {row['device_us_per_img']} us/img, CPU {row['cpu_ms_per_img']} ms/img"
            )
            for k in row["top"][:6]:
                print(f"    {k['us_per_img']:>8} us/img  x{k['calls']:<5} {k['name'][:90]}")
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "method": (
                f"ExpertCore (decoder {args.decoder}, compiled: {not args.no_compile}) in one "
                f"process, the replica's context asleep on host waits; phases: each synced, "
                f"medians of {args.batches_n} batches; kernels: torch.profiler over "
                f"{args.batches_n} batches run as the replica runs them"
            ),
            "start_s": round(start_s, 1),
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
