"""Where the inference replica's CPU goes, without Serve: calls of encoded JPEGs through
``InferenceStage`` (decode, resize, batch, model, answers) in one process.

    python benchmarks/profile_inference.py [--config benchmarks/configs/ferry_e2e.yaml]
        [--groups 1,8,32] [--calls 16] [--seconds 4] [--out results/profile_inference.json]

For each group size (images per call, as the ingress coalesces them) it keeps ``--calls``
calls in flight for ``--seconds`` and reports img/s and the process's CPU ms per image;
then it splits that CPU time by phase (the thread time spent inside each of the stage's
methods, summed over threads) so the per-call and per-image costs show. The inference
replica is one process with one event loop: its CPU per image bounds the whole
pipeline's rate.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import sys
import threading
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, today, write_json  # noqa: E402

PHASES = defaultdict(float)
CALLS = defaultdict(int)
_depth = threading.local()


def timed(obj: object, name: str, label: str) -> None:
    """Wrap the plain method ``obj.name`` (run in some thread) to add the calling thread's CPU time inside it to ``PHASES[label]``
    (outermost wrapped call only, so phases do not count twice)."""
    fn = getattr(obj, name)

    @functools.wraps(fn)
    def wrap(*a, **k):
        d = getattr(_depth, "n", 0)
        _depth.n = d + 1
        t0 = time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            _depth.n = d
            if d == 0:
                PHASES[label] += time.thread_time() - t0
                CALLS[label] += 1

    setattr(obj, name, wrap)


async def drive(core, items, group: int, calls: int, seconds: float) -> dict:
    from pipeline.stages.messages import PostSpec, RequestMeta

    meta = [RequestMeta(f"r{i}", None, False) for i in range(group)]
    specs = [PostSpec("classify", top_k=5) for _ in range(group)]
    batch = items[:group]

    async def one():
        return await core.encoded("resnet50", batch, meta, specs)

    for _ in range(3):
        await one()
    PHASES.clear()
    CALLS.clear()
    done = 0
    t0, c0 = time.perf_counter(), time.process_time()
    loop_thread0 = time.thread_time()

    async def worker():
        nonlocal done
        while time.perf_counter() - t0 < seconds:
            out = await one()
            done += len(out)

    await asyncio.gather(*(worker() for _ in range(calls)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    loop_cpu = time.thread_time() - loop_thread0
    n = max(done, 1)
    return {
        "group": group,
        "calls_in_flight": calls,
        "img_s": done / wall,
        "cpu_ms_per_img": cpu * 1e3 / n,
        "event_loop_ms_per_img": loop_cpu * 1e3 / n,
        "event_loop_busy": loop_cpu / wall,
        "phase_ms_per_img": {k: v * 1e3 / n for k, v in sorted(PHASES.items())},
        "phase_calls": dict(CALLS),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="benchmarks/configs/ferry_e2e.yaml")
    ap.add_argument("--groups", default="1,8,32")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--out", default="benchmarks/results/profile_inference.json")
    ap.add_argument("--cpu", action="store_true", help="numpy backend, CPU decode (no GPU)")
    args = ap.parse_args()
    import numpy as np
    import skimage.data
    import yaml

    from pipeline.config import PipelineConfig
    from pipeline.imaging import encode_jpeg
    from pipeline.stages.build import build_inference
    from pipeline.stages.messages import Encoded

    with open(args.config) as f:
        raw = yaml.safe_load(f)["applications"][0]["args"]["config"]
    if args.cpu:
        raw["executor"] = {**raw["executor"], "backend": "numpy", "buckets": [1, 8, 32]}

        raw["preprocess"] = {"threads": 2}
        raw["inference_deployment"] = {**raw.get("inference_deployment", {}), "num_gpus": 0}
    cfg = PipelineConfig.model_validate(raw)
    # as one_process builds it: decode, model and answers in this process
    core = build_inference(cfg, decode_here=True, answer_here=True)
    # the GPU stage's work is its core's (PreprocessGpuStage wraps a PreprocessGpuCore)
    pre = getattr(core.decoder, "core", core.decoder)
    for obj, name, label in (
        (pre, "_one_round", "decode_and_fit_round (GPU thread)"),
        (core, "_submit", "executor_prepare_commit (submit thread)"),
        (core.answerer, "run", "postprocess (worker thread)"),
        (pre.cpu if hasattr(pre, "cpu") else pre, "decode_one", "cpu_decode (pool threads)"),
    ):
        if obj is not None and hasattr(obj, name):
            timed(obj, name, label)
    blob = encode_jpeg(np.ascontiguousarray(skimage.data.chelsea()), 90)
    groups = [int(g) for g in args.groups.split(",") if g]
    target = pre.targets["resnet50"]
    items = [Encoded.checked(blob, "image/jpeg", target, 1 << 31, 1 << 36)] * max(groups)
    rows = []
    for g in groups:
        r = asyncio.run(drive(core, items, g, args.calls, args.seconds))
        rows.append(r)
        print(json.dumps(r), flush=True)
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "config": args.config + (" (CPU variant)" if args.cpu else ""),
            "method": (
                f"InferenceStage in one process, no Serve; {args.calls} calls in flight, "
                f"{args.seconds} s per group size; chelsea JPEG 451x300 q90"
            ),
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
