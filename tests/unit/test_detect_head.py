"""``DetectHead`` (a YOLO-style head's boxes, best class and score, the ``detect`` task's
epilogue) against the head decoded as the host decodes the rest (``tasks/detect.py``:
activation, objectness, argmax over the scores, corners in float64): the same classes and
scores to the bit, the same corners to float32's rounding, in fp32 and fp16, for every
activation, objectness, box format and normalisation it takes; which heads it takes; and a
detection model's image feed ending in it, the stage answering from its boxes."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.engines.base import ImageInput, TensorInfo
from pipeline.errors import InvalidInput
from pipeline.models.repository import ModelCard
from pipeline.ops.base import TensorSpec, eager
from pipeline.ops.detect_head import DETECT_HEAD, head_attrs
from pipeline.tasks.detect import class_scores, decode_boxes, detections
from pipeline.tasks.options import for_image, parse_options
from pipeline.tasks.spec import resolve_task


def _task(values: int = 7, **output):
    entry = ModelConfig.model_validate(
        {"name": "m", "engine": "onnx", "source": "/m.onnx", "task": "detect", "output": output}
    )
    card = ModelCard(
        "m", "onnx", ImageInput(64, 64, 3, (0.5,) * 3, (0.25,) * 3, "nchw", "stretch"),
        "float32", None, None,
    )  # fmt: skip
    return resolve_task(entry, card, (TensorInfo("o", "float32", (-1, 40, values)),))


def _reference(task, x: np.ndarray):
    """The head decoded the host's way: every class scored, then the best taken."""
    out = np.asarray(x, np.float32)
    obj = out[..., 4] if task.objectness else None
    raw = out[..., 5:] if task.objectness else out[..., 4:]
    scores = class_scores(task, raw, obj)
    best = scores.argmax(axis=-1)
    score = np.take_along_axis(scores, best[..., None], axis=-1)[..., 0]
    return decode_boxes(task, out[..., :4], None), score.astype(np.float32), best


CASES = [
    {"activation": "none"},
    {"activation": "none", "objectness": False},
    {"activation": "sigmoid"},
    {"activation": "sigmoid", "objectness": False, "box_format": "xyxy"},
    {"activation": "none", "box_format": "xyxy", "normalized": True},
    {"activation": "sigmoid", "normalized": True},
]


@pytest.mark.parametrize("output", CASES)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_op_answers_as_the_host_decodes(output, dtype):
    values = 7 if output.get("objectness", True) else 6  # 4 + objectness + 2 classes
    task = _task(values, **output)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 40, values), np.float32) * 3
    x[..., :4] = rng.uniform(0, 1 if task.normalized else 64, (3, 40, 4))
    if task.objectness:
        x[0, :5, 4] = 0.0  # every class scores 0: the first one is the box's
    x = x.astype(dtype)
    (y,) = eager(DETECT_HEAD, x, **{**head_attrs(task), "keep": None})  # every box, in order
    assert y.shape == (3, 40, 6) and y.dtype == np.float32
    boxes, score, best = _reference(task, x)
    np.testing.assert_array_equal(y[..., 5].astype(np.int64), best)
    np.testing.assert_array_equal(y[..., 4], score)
    np.testing.assert_allclose(y[..., :4], boxes, rtol=1e-6, atol=1e-5)
    if task.objectness and task.activation == "none":
        assert (x[..., 4] < 0).any()  # (the lowest raw score wins there: checked above)
    # as the task runs it: each image's boxes ranked, the best first (all 40 of them kept)
    (ranked,) = eager(DETECT_HEAD, x, **head_attrs(task))
    order = np.argsort(-score, axis=1, kind="stable")
    np.testing.assert_array_equal(ranked, np.take_along_axis(y, order[..., None], axis=1))


def test_keep_ranks_each_images_boxes_and_keeps_the_best():
    """``keep=K``: each image's K highest-scoring boxes, best first; equal scores in the
    head's order (-0.0 with 0.0), as the NMS after it takes its candidates."""
    task = _task(activation="none", objectness=False, box_format="xyxy")
    rng = np.random.default_rng(8)
    x = rng.uniform(0, 64, (2, 40, 6)).astype(np.float32)
    x[..., 4:] = rng.integers(-2, 3, (2, 40, 2)).astype(np.float32)  # scores with many ties
    x[0, 3, 4:] = -0.0  # a box whose best score is -0.0 ranks with those of 0.0
    (every,) = eager(DETECT_HEAD, x, **{**head_attrs(task), "keep": None})
    (y,) = eager(DETECT_HEAD, x, **{**head_attrs(task), "keep": 7})
    assert y.shape == (2, 7, 6)
    for i in range(2):
        s = every[i, :, 4]
        want = sorted(range(40), key=lambda j: (-s[j], j))[:7]
        np.testing.assert_array_equal(y[i], every[i, want])
    assert eager(DETECT_HEAD, x, **{**head_attrs(task), "keep": 999})[0].shape == (2, 40, 6)
    with pytest.raises(InvalidInput, match="keep"):
        DETECT_HEAD.prepare(TensorSpec((2, 40, 6), "float32"), objectness=False, keep=0)


def test_the_heads_it_takes_and_those_the_host_decodes():
    assert head_attrs(_task()) == {
        "objectness": True, "activation": "none", "box_format": "cxcywh", "scale": None,
        "keep": 40,  # max_candidates (512), at most the head's boxes
    }  # fmt: skip
    assert head_attrs(_task(normalized=True))["scale"] == (64.0, 64.0)
    assert head_attrs(_task(activation="softmax")) is None
    assert head_attrs(_task(background=0)) is None
    with pytest.raises(InvalidInput, match="class scores"):
        DETECT_HEAD.prepare(TensorSpec((2, 40, 5), "float32"), objectness=True)
    with pytest.raises(InvalidInput, match="activation"):
        DETECT_HEAD.prepare(TensorSpec((2, 40, 7), "float32"), activation="softmax")


def test_detections_read_the_ops_boxes_as_the_raw_head():
    """The answers from the op's [N, B, 6] (``on_device``: the epilogue ran) are the answers
    from the raw head, request by request, thresholds and NMS included."""
    task = _task()
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 40, 7), np.float32)
    x[..., :2] = rng.uniform(0, 64, (2, 40, 2))
    x[..., 2:4] = rng.uniform(4, 24, (2, 40, 2))
    opts = [
        for_image(parse_options("detect", q, None), 100, 200, "png")
        for q in ({}, {"score_threshold": "0.1", "iou_threshold": "0.3"})
    ]
    raw = detections(task, (x,), None, opts, str)
    (y,) = eager(DETECT_HEAD, x, **head_attrs(task))
    assert detections(task, (y,), None, opts, str, on_device=True) == raw
    assert any(d["boxes"] for d in raw)


def test_a_detection_models_image_feed_ends_in_the_op(tmp_path):
    torch = pytest.importorskip("torch")
    from pipeline.engines.epilogue import has_epilogue
    from pipeline.imaging import encode_png
    from pipeline.models.repository import load_entry, model_card
    from pipeline.stages.build import build_inference
    from pipeline.stages.messages import Encoded, PostSpec, RequestMeta
    from tests.models import tasks as tm

    torch.jit.trace(tm.yolo_squares(), torch.zeros(1, 3, 64, 64)).save(str(tmp_path / "y.pt"))
    cfg = PipelineConfig.model_validate(
        {
            "placement": "split",
            "models": [{"name": "yolo", "engine": "torch", "source": str(tmp_path / "y.pt"),
                        "task": "detect", "input": {"resize": "stretch", "height": 64,
                                                    "width": 64, "mean": [0, 0, 0],
                                                    "std": [1, 1, 1]}}],
            "executor": {"backend": "numpy", "buckets": [1, 2]},
        }
    )  # fmt: skip
    eng = load_entry(cfg.models[0]).engine
    assert has_epilogue(eng)
    assert [str(s) for s in eng.plan(2, "image").outputs] == ["float32[2, 32, 6]", "uint8[2]"]
    stage = build_inference(cfg, decode_here=True, answer_here=True)
    assert stage.epilogued == {"yolo"}
    entry = cfg.models[0]
    card = model_card(entry)
    task = resolve_task(entry, card, stage.signatures()["yolo"][1])
    img = tm.squares_image([(0, 0, "red"), (2, 3, "green")])
    item = Encoded.checked(encode_png(img), "image/png", card.target(), 1 << 24, 1 << 28)
    opts = for_image(parse_options("detect", {}, None), 64, 64, "png")
    spec = PostSpec("detect", task=task, options=opts)
    (a,) = asyncio.run(stage.encoded("yolo", [item], [RequestMeta("r")], [spec]))
    got = sorted((b["box"], b["label"]) for b in a.result["boxes"])
    assert [b for b, _ in got] == [[0.0, 0.0, 16.0, 16.0], [48.0, 32.0, 64.0, 48.0]]
