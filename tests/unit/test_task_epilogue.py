"""A task's epilogue inside the batch, without Ray: an image model's image feed ends in uint8
pixels and each row's finiteness (its tensors feed keeps the raw output), a segmentation's
in its mask, in the same arena; the inference stage hands the bytes on and the answers are
numpy's; a NaN output is still NonFiniteOutput; a captured batch replays the model's graph
and then enqueues the epilogue."""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pytest
from PIL import Image

from pipeline.config import PipelineConfig
from pipeline.device import Backend, Stream
from pipeline.engines.epilogue import EpilogueGraph, has_epilogue
from pipeline.errors import NonFiniteOutput
from pipeline.imaging import encode_png
from pipeline.models.repository import load_entry, model_card
from pipeline.stages.messages import Encoded, PostSpec, RequestMeta
from pipeline.tasks.options import for_image, parse_options
from pipeline.tasks.spec import resolve_task
from tests.models import tasks as tm

onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("epilogue")
    onnx.save(tm.filter_onnx(16), str(d / "filter.onnx"))

    class Log(torch.nn.Module):
        def forward(self, x):
            return torch.log(x)  # NaN where the normalised input is negative

    torch.jit.trace(Log(), torch.ones(1, 3, 16, 16)).save(str(d / "log.pt"))
    return d


def config(files) -> PipelineConfig:
    stretch = {"resize": "stretch", "height": 16, "width": 16}
    return PipelineConfig.model_validate(
        {
            "placement": "split",
            "models": [
                {"name": "filter", "engine": "onnx", "source": str(files / "filter.onnx"),
                 "input": stretch},
                {"name": "log", "engine": "torch", "source": str(files / "log.pt"),
                 "task": "image", "input": stretch},
            ],
            "executor": {"backend": "numpy", "buckets": [1, 2]},
        }
    )  # fmt: skip


def test_the_image_feed_ends_in_bytes_and_the_tensors_feed_does_not(files):
    entry = config(files).models[0]
    loaded = load_entry(entry)
    eng = loaded.engine
    assert has_epilogue(eng) and eng.name == "onnx"
    img, tensors = eng.plan(2, "image"), eng.plan(2, "tensors")
    assert [str(s) for s in img.outputs] == ["uint8[2, 16, 16, 3]", "uint8[2]"]
    assert [str(s) for s in tensors.outputs] == ["float32[2, 3, 16, 16]"]
    assert img.arena_bytes > eng.inner.plan(2, "image").arena_bytes


def ask(stage, cfg, model: str, img: np.ndarray):
    entry = next(m for m in cfg.models if m.name == model)
    card = model_card(entry)
    task = resolve_task(entry, card, stage.signatures()[model][1])
    item = Encoded.checked(encode_png(img), "image/png", card.target(), 1 << 24, 1 << 28)
    opts = for_image(parse_options("image", {}, None), 16, 16, "png")
    specs = [PostSpec("image", task=task, options=opts)]
    return asyncio.run(stage.encoded(model, [item], [RequestMeta("r")], specs))[0]


def test_the_stage_answers_from_the_epilogues_bytes(files):
    from pipeline.stages.build import build_inference

    cfg = config(files)
    stage = build_inference(cfg, decode_here=True, answer_here=True)
    assert stage.epilogued == {"filter", "log"}
    img = np.random.default_rng(0).integers(0, 256, (16, 16, 3), dtype=np.uint8)
    a = ask(stage, cfg, "filter", img)
    got = np.asarray(Image.open(io.BytesIO(a.media)))
    assert np.abs(got.astype(int) - tm.filter_reference(img)).max() <= 1
    assert isinstance(ask(stage, cfg, "log", img), NonFiniteOutput)  # never pixels


def test_a_captured_batch_replays_the_model_then_enqueues_the_epilogue():
    calls = []

    class Graph:
        def launch(self, raw):
            calls.append(("graph", raw))

    class Bound:
        def run_epilogue(self, stream):
            calls.append(("epilogue", stream.name))

    stream = Stream("compute0", Backend("numpy"))
    EpilogueGraph(Graph(), Bound(), stream).launch("raw")
    assert calls == [("graph", "raw"), ("epilogue", "compute0")]


def test_an_image_models_warm_up_takes_its_inner_engines_compile_gate(files):
    """The epilogue wraps the model's engine; the warm-up's compile gate is the inner one's
    (2026-12-06: the wrapper's was the base class's no-op, so a torch U-Net's replicas all
    compiled at once, each with inductor's full worker pool)."""
    import contextlib

    eng = load_entry(config(files).models[1]).engine  # the torch image model
    assert has_epilogue(eng) and eng.inner.name == "torch"
    seen, gate = [], contextlib.nullcontext("the inner engine's gate")
    eng.inner.warm_gate = lambda buckets: seen.append(buckets) or gate
    assert eng.warm_gate((1, 2)) is gate and seen == [(1, 2)]
