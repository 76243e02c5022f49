"""The onnx engine's speed: ResNet-50 imported from ONNX against the hand-built native one,
and ``ferry_onnx`` rows for torchvision models.

    python benchmarks/bench_onnx.py [--out benchmarks/results/onnx.json] [--seconds 2]
        [--batches 1,32,128] [--models resnet18,mobilenet_v2,...]   # --models needs torch

* ``ferry_native``: ``pipeline.models.resnet50`` with seeded random weights.
* ``ferry_onnx``: the same weights written as the ONNX graph torchvision's exporter makes
  (Conv + BatchNormalization + Relu, Add + Relu, MaxPool, GlobalAveragePool, Flatten, Gemm;
  ``tests.onnx_models.resnet50``), imported by the onnx engine, fed the same uint8 batches
  through its image feed. Both through the executor (pinned staging, CUDA graphs on the GPU,
  up to 3 batches in flight), in this one process, measured in turns (native, onnx, native,
  onnx) so drift hits both; the ratio is onnx / native.

``--models`` adds ``ferry_onnx`` rows for torchvision architectures (random init, exported
with torch.onnx.export): img/s at each batch and top-1 agreement with torch fp32 on
scikit-image's photos. ``ferry_onnx_rows`` is the same as a function, for
``bench_models.py`` to call beside its other systems.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, table, today, write_json  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def rate(ex: Any, model: str, batch: int, seconds: float, size: int = 224) -> float:
    """img/s of uint8 batches through the executor's image feed, batches kept in flight."""
    x = np.random.default_rng(batch).integers(0, 256, (batch, size, size, 3), dtype=np.uint8)
    pending: list = []
    for _ in range(2):
        ex.commit(ex.prepare(model, batch), x).wait()
    n, t0 = 0, time.perf_counter()
    while n < 5 or time.perf_counter() - t0 < seconds:
        pending.append(ex.commit(ex.prepare(model, batch), x))
        while pending and pending[0].done():
            pending.pop(0).wait()
        n += 1
    while pending:
        pending.pop(0).wait()
    return n * batch / (time.perf_counter() - t0)


def executor(batches: tuple[int, ...]) -> Any:
    from pipeline.config import ExecutorConfig
    from pipeline.executor import GpuExecutor

    return GpuExecutor(ExecutorConfig(buckets=batches, max_in_flight=3))


def onnx_loaded(name: str, path: str, size: int = 224) -> Any:
    from pipeline.engines.base import ImageInput
    from pipeline.engines.onnx import build

    return build(SimpleNamespace(name=name, source=path), ImageInput(size, size, 3, MEAN, STD))


def resnet50_pair(batches: tuple[int, ...], seconds: float, size: int) -> list[dict]:
    import onnx

    from pipeline.models import resnet50
    from pipeline.models.registry import LoadedModel, model_info
    from tests.onnx_models import resnet50 as resnet50_onnx

    ex = executor(batches)
    graph = resnet50.build(resnet50.random_state_dict(0), "native", size)
    ex.load(LoadedModel("native", model_info("resnet50"), graph, True, "random(seed=0)"))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "resnet50.onnx")
        onnx.save(resnet50_onnx(resnet50.random_state_dict(0), size), path)
        ex.load(onnx_loaded("onnx", path, size))
    ex.warmup()
    rows = []
    for b in batches:
        r = {"native": [], "onnx": []}
        for _ in range(2):
            for system in ("native", "onnx"):
                r[system].append(rate(ex, system, b, seconds / 2, size))
        nat, onx = float(np.mean(r["native"])), float(np.mean(r["onnx"]))
        rows.append(
            {
                "model": "resnet50",
                "batch": b,
                "ferry_native_img_s": round(nat, 1),
                "ferry_onnx_img_s": round(onx, 1),
                "onnx_vs_native": round(onx / nat, 3),
            }
        )
        print(rows[-1], flush=True)
    ex.close()
    return rows


def ferry_onnx_rows(
    arch: str,
    batches: tuple[int, ...],
    seconds: float,
    photos: np.ndarray,
    torch_top1: np.ndarray,
    model: Any = None,
) -> list[dict]:
    """``ferry_onnx`` rows for a torchvision architecture (or the given torch ``model``):
    exported to ONNX, served by the onnx engine; img/s per batch and top-1 agreement of the
    fp16 (GPU) / fp32 (CPU) answers on ``photos`` (uint8 [N, 224, 224, 3]) with torch's."""
    import torch
    import torchvision

    model = model if model is not None else getattr(torchvision.models, arch)(weights=None).eval()
    ex = executor(batches)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, f"{arch}.onnx")
        torch.onnx.export(
            model.cpu(),
            (torch.randn(2, 3, 224, 224),),
            path,
            input_names=["x"],
            output_names=["logits"],
            opset_version=17,
            dynamo=False,
            dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        )
        ex.load(onnx_loaded(arch, path))
    ex.warmup()
    top = max(batches)
    got = np.concatenate(
        [
            ex.commit(ex.prepare(arch, len(c)), c).wait()
            for c in (np.ascontiguousarray(photos[i : i + top]) for i in range(0, len(photos), top))
        ]
    )
    agree = float(np.mean(got.argmax(1) == np.asarray(torch_top1)))
    rows = [
        {
            "model": arch,
            "batch": b,
            "system": "ferry_onnx",
            "img_s": round(rate(ex, arch, b, seconds), 1),
            "top1_agree": round(agree, 4),
        }
        for b in batches
    ]
    ex.close()
    return rows


def torchvision_rows(models: list[str], batches: tuple[int, ...], seconds: float) -> list[dict]:
    import torch
    import torchvision

    from tests.gpu.test_onnx_gpu import photos

    imgs = photos()
    x = torch.from_numpy(
        ((imgs / 255.0 - np.array(MEAN)) / np.array(STD)).transpose(0, 3, 1, 2).astype(np.float32)
    )
    rows = []
    for arch in models:
        m = getattr(torchvision.models, arch)(weights=None).eval()
        with torch.no_grad():
            ref = m(x).argmax(1).numpy()
        rows += ferry_onnx_rows(arch, batches, seconds, imgs, ref, m)
        print(rows[-len(batches) :], flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="benchmarks/results/onnx.json")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--batches", default="1,32,128")
    ap.add_argument("--size", type=int, default=224, help="image size of the ResNet-50 pair")
    ap.add_argument("--models", default="", help="torchvision architectures for ferry_onnx rows")
    args = ap.parse_args()
    batches = tuple(int(b) for b in args.batches.split(","))
    pair = resnet50_pair(batches, args.seconds, args.size)
    models = [m for m in args.models.split(",") if m]
    tv = torchvision_rows(models, batches, args.seconds) if models else []
    from pipeline.device import cuda_available

    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "backend": "cupy fp16" if cuda_available() else "numpy fp32",
            "resnet50": f"seeded random weights, {args.size}x{args.size}, uint8 input through the image feed",
            "method": "one process, one executor, native and onnx measured in turns, mean of 2 turns each",
            "resnet50_pair": pair,
            "ferry_onnx_rows": tv,
        },
    )
    print(table(pair, ["batch", "ferry_native_img_s", "ferry_onnx_img_s", "onnx_vs_native"]))
    if tv:
        print(table(tv, ["model", "batch", "img_s", "top1_agree"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
