"""The task models through the inference stage on the GPU -- the epilogues on cupy inside the
batch (``Denormalize``, ``ArgmaxMask``, ``DetectHead``), the answers made from their bytes --
against the same stage on numpy: an image answer within a grey level (PNG, lossless), the
same class areas and mask, and the same boxes to a hundredth of a pixel.

Written without a GPU (2026-12-05): not yet run on one."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tests.models import tasks as tm

    d = tmp_path_factory.mktemp("task_models_gpu")
    onnx.save(tm.filter_onnx(64), str(d / "filter.onnx"))
    torch.jit.trace(tm.fcn(), torch.zeros(1, 3, 64, 64)).save(str(d / "fcn.pt"))
    torch.jit.trace(tm.yolo_squares(), torch.zeros(1, 3, 64, 64)).save(str(d / "yolo.pt"))
    size = {"height": 64, "width": 64}
    return [
        {"name": "filter", "engine": "onnx", "source": str(d / "filter.onnx"), "task": "image",
         "input": {"resize": "stretch", **size}},
        {"name": "seg", "engine": "torch", "source": str(d / "fcn.pt"), "task": "segment",
         "input": size},
        {"name": "yolo", "engine": "torch", "source": str(d / "yolo.pt"), "task": "detect",
         "input": {**size, "mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0]}},
    ]  # fmt: skip


def _stage(models, backend: str):
    from pipeline.config import PipelineConfig
    from pipeline.stages.build import build_inference

    cfg = PipelineConfig.model_validate(
        {
            "placement": "split",
            "models": models,
            "executor": {"backend": backend, "buckets": [1, 2, 4]},
            "preprocess": {"decoder": "cpu", "encoder": "cpu"},
        }
    )
    return cfg, build_inference(cfg, decode_here=True, answer_here=True)


def _ask(cfg, stage, model: str, imgs: list[np.ndarray], query: dict) -> list:
    from pipeline.imaging import encode_png
    from pipeline.models.repository import model_card
    from pipeline.stages.messages import Encoded, PostSpec, RequestMeta
    from pipeline.tasks.options import for_image, parse_options
    from pipeline.tasks.spec import resolve_task

    entry = next(m for m in cfg.models if m.name == model)
    card = model_card(entry)
    task = resolve_task(entry, card, stage.signatures()[model][1])
    items, specs = [], []
    for img in imgs:
        items.append(Encoded.checked(encode_png(img), "image/png", card.target(), 1 << 24, 1 << 28))
        opts = for_image(parse_options(task.kind, query, None), *img.shape[:2], "png")
        specs.append(PostSpec(task.kind, task=task, options=opts))
    meta = [RequestMeta(f"r{i}") for i in range(len(imgs))]
    return asyncio.run(stage.encoded(model, items, meta, specs))


def test_the_task_models_answer_on_the_gpu_as_on_numpy(models):
    from tests.models import tasks as tm

    cfg_g, gpu = _stage(models, "cupy")
    cfg_c, cpu = _stage(models, "numpy")
    assert gpu.epilogued == {"filter", "seg", "yolo"}
    rng = np.random.default_rng(0)
    photos = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in ((64, 64), (80, 120))]
    squares = [
        tm.squares_image([(0, 0, "red"), (2, 3, "green")]),
        tm.squares_image([(1, 1, "green"), (3, 0, "red"), (3, 3, "red")]),
    ]

    got, want = _ask(cfg_g, gpu, "filter", photos, {}), _ask(cfg_c, cpu, "filter", photos, {})
    for g, c in zip(got, want, strict=True):
        a, b = (np.asarray(Image.open(io.BytesIO(x.media))).astype(int) for x in (g, c))
        assert a.shape == b.shape and np.abs(a - b).max() <= 1  # fp16 against fp32

    for fmt in ("json", "png"):
        got = _ask(cfg_g, gpu, "seg", photos, {"format": fmt})
        want = _ask(cfg_c, cpu, "seg", photos, {"format": fmt})
        for g, c in zip(got, want, strict=True):
            if fmt == "png":
                a, b = (np.asarray(Image.open(io.BytesIO(x.media))) for x in (g, c))
                assert a.shape == b.shape and (a != b).mean() < 0.01  # fp16 ties, at most
            else:  # the same areas, but for the pixels an fp16 tie may flip
                assert (g.result["height"], g.result["width"]) == (
                    c.result["height"], c.result["width"],
                )  # fmt: skip
                total = c.result["height"] * c.result["width"]
                ga = {k["class"]: k["pixels"] for k in g.result["classes"]}
                ca = {k["class"]: k["pixels"] for k in c.result["classes"]}
                assert sum(abs(ga.get(k, 0) - ca.get(k, 0)) for k in set(ga) | set(ca)) < total / 50

    got = _ask(cfg_g, gpu, "yolo", squares, {})
    want = _ask(cfg_c, cpu, "yolo", squares, {})
    for g, c in zip(got, want, strict=True):
        gb = [(b["box"], b["class"]) for b in g.result["boxes"]]
        cb = [(b["box"], b["class"]) for b in c.result["boxes"]]
        assert gb == cb and len(gb) in (2, 3)
