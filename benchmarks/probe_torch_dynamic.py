"""One compile for every batch size: a torchvision model through ``torch.compile`` with the
batch dimension dynamic, against one static compile per bucket, on the GPU.

The torch engine compiles a static graph per bucket (``dynamic=False``), so each bucket
costs a compile at start-up, and a model served at few buckets pads its batches far (a batch
of 9 runs at 32 with the buckets 8/32/128). A batch-dynamic compile is one compile whatever
the buckets; this probe measures what it costs in the kernels' speed: each form's compile
seconds, and each bucket's time a batch as a replayed CUDA graph (fp16, channels-last,
inductor's freezing, as the torch engine compiles). Both forms in one process, one after
the other, on the same weights.

    python benchmarks/probe_torch_dynamic.py --model resnet50 --static 8,16,32 \
        --buckets 1,8,12,16,24,32,64,128 --out /tmp/out/dynamic.json
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def _compiled(torch: Any, module: Any, dynamic: bool) -> Any:
    import torch._dynamo as dynamo

    dynamo.reset()
    return torch.compile(module, dynamic=None if dynamic else False)


def _input(torch: Any, batch: int) -> Any:
    x = torch.randn(batch, 3, 224, 224, device="cuda", dtype=torch.float16)
    return x.contiguous(memory_format=torch.channels_last)


def measure(torch: Any, fn: Any, batch: int, dynamic: bool, steps: int) -> dict[str, float]:
    """The first call's seconds (a compile, or none), then a CUDA graph's ms a batch."""
    x = _input(torch, batch)
    if dynamic and batch > 1:
        torch._dynamo.maybe_mark_dynamic(x, 0)  # as the torch engine marks it
    t0 = time.perf_counter()
    with torch.inference_mode():
        fn(x)
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.inference_mode(), torch.cuda.stream(side):
        for _ in range(3):
            fn(x)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.inference_mode(), torch.cuda.graph(g):
        fn(x)
    for _ in range(10):
        g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):  # the best of three windows
        t0 = time.perf_counter()
        for _ in range(steps):
            g.replay()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / steps)
    return {"first_call_s": round(first_s, 2), "ms": round(best * 1e3, 4),
            "img_s": round(batch / best, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--static", default="8,16,32")
    ap.add_argument("--buckets", default="1,8,12,16,24,32,64,128")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--cudnn-benchmark", action="store_true")
    ap.add_argument("--out", default="dynamic.json")
    args = ap.parse_args(argv)
    import torch
    import torch._inductor.config as ic
    import torchvision

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    ic.freezing = True
    torch._dynamo.config.cache_size_limit = 1024
    m = getattr(torchvision.models, args.model)(weights=None).eval().cuda().half()
    m = m.to(memory_format=torch.channels_last)
    out: dict[str, Any] = {
        "what": __doc__.split("\n\n")[0],
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "model": args.model,
        "cudnn_benchmark": args.cudnn_benchmark,
        "forms": {},
    }
    forms = (("dynamic", True, args.buckets), ("static", False, args.static))
    for name, dynamic, buckets in forms:
        t0 = time.perf_counter()
        fn = _compiled(torch, m, dynamic)
        rows = {}
        for b in [int(v) for v in buckets.split(",")]:
            rows[b] = measure(torch, fn, b, dynamic, args.steps)
            print(name, b, rows[b], flush=True)
        out["forms"][name] = {"total_s": round(time.perf_counter() - t0, 1), "buckets": rows}
        with open(args.out, "w") as f:
            json.dump(out, f, indent=2)
    dyn, st = out["forms"]["dynamic"]["buckets"], out["forms"]["static"]["buckets"]
    for b in st:
        if b in dyn:
            print(f"batch {b}: dynamic / static img/s = {dyn[b]['img_s'] / st[b]['img_s']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
