"""Models benchmark: the 13 torchvision classifiers (random weights, randomised batch norms) at
batch 1, 32 and 128, fp16 on one GPU, from host uint8 batches, three batches in flight.

Systems (rows ``{"model", "batch", "system", "img_s", "top1_agree"}``):

* ``ferry_torch``   -- Ferry's executor with the torch engine: torch.compile (default mode,
  freezing) in Ferry's CUDA graphs on Ferry's streams, fed from Ferry's pinned ring.
* ``torch_compile`` -- the same compiled module (the very kernels ferry_torch runs: it is
  compiled once per model and batch and shared) in torch's own CUDA graphs, one per stream,
  3 streams, each fed from its own pinned uint8 buffer: the harness every torch peer gets.
* ``torch_eager``   -- the module in fp16 channels-last, eager, same 3-stream harness.
* ``ferry_native``  -- Ferry's own op graph, where a native build exists (resnet50).
* ``ferry_onnx``    -- the onnx engine on the model exported with torch.onnx (opt-in).

``top1_agree`` is the share of real photos (loadtest.corpus, through Ferry's CPU image
path) whose top-1 equals torch fp32's. torch.compile takes ~10-20 s per model and batch, so
the whole matrix takes longer than one 10-minute command on an H200: restrict it with
``--models``/``--batches`` and add to the same JSON (``--merge``, the default).

    python benchmarks/bench_models.py --models resnet50,mobilenet_v3_large --batches 1,32,128
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import deque
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, table, today, write_json  # noqa: E402
from benchmarks.model_zoo import MODELS, make, normalised, photo_pixels  # noqa: E402

SYSTEMS = ("ferry_torch", "torch_compile", "torch_eager", "ferry_native")
OPTIONAL = ("ferry_onnx",)
NATIVE = {"resnet50"}  # architectures Ferry builds natively
IN_FLIGHT = 3


def _timed(step: Any, drain: Any, batch: int, seconds: float) -> float:
    """img/s of ``step()`` (enqueues one batch, keeps ``IN_FLIGHT`` out) over ``seconds``."""
    t_end = time.perf_counter() + 0.3
    while time.perf_counter() < t_end:
        step()
    drain()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
        n += 1
    drain()
    return n * batch / (time.perf_counter() - t0)


def _agree(top1: np.ndarray, ref: np.ndarray) -> float:
    return round(float((top1 == ref).mean()), 4)


def _chunks(u8: np.ndarray, b: int) -> list[np.ndarray]:
    """The photos in batches of exactly ``b`` (the last padded with the first photos)."""
    n = -(-len(u8) // b) * b
    padded = np.concatenate([u8, u8[np.arange(n - len(u8)) % len(u8)]])
    return [padded[i : i + b] for i in range(0, n, b)]


# ----------------------------------------------------------------------------- Ferry


COMPUTE_STREAMS = [1]  # Ferry's compute streams (--compute-streams; the executor's default 1)


def ferry_executor(entry: Any, batch: int) -> Any:
    from pipeline.config import ExecutorConfig
    from pipeline.executor import GpuExecutor

    ex = GpuExecutor(
        ExecutorConfig(
            backend="cupy",
            buckets=(batch,),
            max_in_flight=IN_FLIGHT,
            compute_streams=COMPUTE_STREAMS[0],
            pool_limit_fraction=0.5,
        )
    )
    if hasattr(entry, "engine") and hasattr(entry, "graph"):  # a LoadedModel (native)
        ex.load(entry)
    else:
        ex.load_entry(entry)
    ex.warmup()
    return ex


def run_ferry(ex: Any, name: str, batch: int, u8: np.ndarray, ref: np.ndarray, seconds: float):
    """Batches go in as the inference stage sends them: prepare + commit (the copy into the
    pinned slot included) from a pool of submit threads, ``IN_FLIGHT`` batches out."""
    from concurrent.futures import ThreadPoolExecutor

    x = np.random.default_rng(0).integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)
    out: deque = deque()
    pool = ThreadPoolExecutor(IN_FLIGHT, thread_name_prefix="bench-submit")

    def step() -> None:
        if len(out) >= IN_FLIGHT:
            out.popleft().result().wait(60)
        out.append(pool.submit(lambda: ex.commit(ex.prepare(name, batch), x)))

    def drain() -> None:
        while out:
            out.popleft().result().wait(60)

    img_s = _timed(step, drain, batch, seconds)
    pool.shutdown()
    top = [ex.infer(name, c).argmax(1) for c in _chunks(u8, batch)]
    return img_s, _agree(np.concatenate(top)[: len(u8)], ref)


# ----------------------------------------------------------------------------- torch peers


def torch_harness(fn: Any, batch: int, seconds: float, graphs: bool, u8: np.ndarray, ref):
    """3 streams, each with a pinned uint8 buffer, a device input and (``graphs``) a CUDA graph
    of copy-normalise-model; batches round-robin, one in flight per stream."""
    import torch

    dev = torch.device("cuda")
    streams = [torch.cuda.Stream() for _ in range(IN_FLIGHT)]
    rng = np.random.default_rng(0)
    host = [
        torch.from_numpy(rng.integers(0, 256, (batch, 224, 224, 3), dtype=np.uint8)).pin_memory()
        for _ in streams
    ]
    dev_in = [torch.empty_like(h, device=dev) for h in host]
    outs, replays = [], []
    with torch.inference_mode():
        for k, s in enumerate(streams):
            with torch.cuda.stream(s):
                dev_in[k].copy_(host[k], non_blocking=True)
                y = fn(dev_in[k]).float()
            torch.cuda.synchronize()
            if graphs:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"):
                    y = fn(dev_in[k]).float()
                replays.append(g.replay)
            else:
                replays.append(lambda k=k: outs[k].copy_(fn(dev_in[k]).float()))
            outs.append(y)
    out_host = [torch.empty(o.shape, dtype=o.dtype).pin_memory() for o in outs]
    events = [torch.cuda.Event() for _ in streams]
    state = {"i": 0}

    def step() -> None:
        k = state["i"] % IN_FLIGHT
        state["i"] += 1
        events[k].synchronize()
        with torch.inference_mode(), torch.cuda.stream(streams[k]):
            dev_in[k].copy_(host[k], non_blocking=True)
            replays[k]()
            out_host[k].copy_(outs[k], non_blocking=True)
            events[k].record()

    def drain() -> None:
        torch.cuda.synchronize()

    img_s = _timed(step, drain, batch, seconds)
    top = []
    with torch.inference_mode():
        for c in _chunks(u8, batch):
            top.append(fn(torch.from_numpy(c).to(dev)).argmax(1).cpu().numpy())
    return img_s, _agree(np.concatenate(top)[: len(u8)], ref)


def eager_fn(model: Any) -> Any:
    import torch

    m = model.half().to(memory_format=torch.channels_last).eval()
    mean = torch.tensor([v * 255 for v in (0.485, 0.456, 0.406)], device="cuda").view(1, 3, 1, 1)
    scale = torch.tensor([1 / (v * 255) for v in (0.229, 0.224, 0.225)], device="cuda").view(
        1, 3, 1, 1
    )

    def fn(x: Any) -> Any:
        y = ((x.permute(0, 3, 1, 2).float() - mean) * scale).half()
        return m(y.contiguous(memory_format=torch.channels_last))

    return fn


# ----------------------------------------------------------------------------- main


def bench_model(name: str, batches: list[int], systems: list[str], seconds: float, tmp: str):
    import torch

    from pipeline.config import ModelConfig

    rows, compile_s = [], {}
    u8 = photo_pixels(20)
    model = make(name, device="cuda")
    with torch.inference_mode():
        ref = model(torch.from_numpy(normalised(u8)).cuda()).argmax(1).cpu().numpy()
    sd_path = os.path.join(tmp, f"{name}.pt")
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, sd_path)
    entry = ModelConfig(name=name, engine="torch", source=name, weights=sd_path)
    for b in batches:
        shared = None
        if "ferry_torch" in systems or "torch_compile" in systems:
            t0 = time.perf_counter()
            ex = ferry_executor(entry, b)
            compile_s[f"{name}@{b}"] = round(time.perf_counter() - t0, 1)
            shared = ex.models[name].engine.fn["image"]
            if "ferry_torch" in systems:
                rows.append(_row(name, b, "ferry_torch", *run_ferry(ex, name, b, u8, ref, seconds)))
            if "torch_compile" in systems:
                r = torch_harness(shared, b, seconds, True, u8, ref)
                rows.append(_row(name, b, "torch_compile", *r))
            ex.close()
        if "torch_eager" in systems:
            fn = eager_fn(make(name, device="cuda"))
            rows.append(
                _row(name, b, "torch_eager", *torch_harness(fn, b, seconds, False, u8, ref))
            )
        if "ferry_native" in systems and name in NATIVE:
            from pipeline.models import resnet50
            from pipeline.models.registry import LoadedModel, model_info

            sd = {k: v.cpu().numpy() for k, v in model.state_dict().items()}
            lm = LoadedModel(name, model_info("resnet50"), resnet50.build(sd, name), False, "zoo")
            ex = ferry_executor(lm, b)
            rows.append(_row(name, b, "ferry_native", *run_ferry(ex, name, b, u8, ref, seconds)))
            ex.close()
        if "ferry_onnx" in systems:  # the onnx engine (pipeline/engines/onnx.py) on an export
            path = os.path.join(tmp, f"{name}.onnx")
            if not os.path.exists(path):
                x = torch.zeros(1, 3, 224, 224, device="cuda")
                torch.onnx.export(
                    model.float(),
                    (x,),
                    path,
                    dynamic_axes={"input": {0: "batch"}},
                    input_names=["input"],
                    dynamo=False,
                )
            ex = ferry_executor(ModelConfig(name=name, engine="onnx", source=path), b)
            rows.append(_row(name, b, "ferry_onnx", *run_ferry(ex, name, b, u8, ref, seconds)))
            ex.close()
        torch.cuda.empty_cache()
        print(
            table(
                [r for r in rows if r["batch"] == b],
                ["model", "batch", "system", "img_s", "top1_agree"],
            ),
            flush=True,
        )
    return rows, compile_s


def _row(model: str, batch: int, system: str, img_s: float, agree: float) -> dict:
    return {
        "model": model,
        "batch": batch,
        "system": system,
        "img_s": round(img_s, 1),
        "top1_agree": agree,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"of {SYSTEMS + OPTIONAL}")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "models.json")
    )
    ap.add_argument("--no-merge", action="store_true", help="replace the file instead of adding")
    ap.add_argument("--compute-streams", type=int, default=1, help="Ferry's compute streams")
    args = ap.parse_args(argv)
    import json

    COMPUTE_STREAMS[0] = args.compute_streams

    models = [m for m in args.models.split(",") if m]
    batches = [int(b) for b in args.batches.split(",")]
    systems = args.systems.split(",")
    old: dict = {"rows": [], "compile_s": {}}
    if os.path.exists(args.out) and not args.no_merge:
        with open(args.out) as f:
            old = json.load(f)
    rows, compile_s = [], dict(old.get("compile_s", {}))
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            r, c = bench_model(name, batches, systems, args.seconds, tmp)
            rows += r
            compile_s.update(c)
    keys = {(r["model"], r["batch"], r["system"]) for r in rows}
    kept = [r for r in old.get("rows", []) if (r["model"], r["batch"], r["system"]) not in keys]
    order = {m: i for i, m in enumerate(MODELS)}
    all_rows = sorted(
        kept + rows, key=lambda r: (order.get(r["model"], 99), r["batch"], r["system"])
    )
    write_json(
        args.out,
        {
            "benchmark": "bench_models",
            "date": today(),
            "machine": machine(),
            "setup": "fp16, host uint8 [N,224,224,3] batches, 3 in flight; random weights with "
            "randomised batch norms; top1_agree against torch fp32 on 20 photos; torch_compile "
            "shares ferry_torch's compiled module (same kernels), in torch's CUDA graphs on 3 "
            "streams with pinned inputs; Ferry submits from 3 threads as its inference stage "
            f"does; Ferry compute streams: {args.compute_streams}",
            "rows": all_rows,
            "compile_s": compile_s,
        },
    )
    print(table(all_rows, ["model", "batch", "system", "img_s", "top1_agree"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
