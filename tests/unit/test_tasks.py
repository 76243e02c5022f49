"""Tasks without Ray: the config's task and output options, a task resolved from a model's
outputs (its defaults and its errors), a request's options (query, Accept, the answer's
memory), detection heads decoded (YOLO, SSD with anchors and a background class) and mapped
back through each resize, and the postprocess stage answering a call of mixed requests."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from pydantic import ValidationError

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.engines.base import ImageInput, TensorInfo
from pipeline.errors import InvalidInput, NonFiniteOutput, NotAcceptable, PayloadTooLarge
from pipeline.models.repository import ModelCard
from pipeline.stages.messages import Logits, PostSpec, RowTimes
from pipeline.stages.postprocess import PostprocessStage
from pipeline.tasks.detect import decode_boxes, detections, to_source
from pipeline.tasks.options import check_work, for_image, negotiate, parse_options
from pipeline.tasks.spec import anchors_of, resolve_task


def entry(**kw) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "engine": "onnx", "source": "/m.onnx", **kw})


def card(size=64, resize="stretch", labels=None, mean=(0.5,) * 3, std=(0.25,) * 3) -> ModelCard:
    image = ImageInput(size, size, 3, mean, std, "nchw", resize)
    return ModelCard("m", "onnx", image, "float32", labels, None)


def outs(*shapes) -> tuple[TensorInfo, ...]:
    return tuple(TensorInfo(f"o{i}", "float32", (-1, *s)) for i, s in enumerate(shapes))


def test_the_config_reads_task_and_output_and_names_a_misplaced_option():
    e = entry(task="detect", output={"head": "ssd", "anchors": [[0.5, 0.5, 1, 1]]})
    assert e.task == "detect" and anchors_of(e).shape == (1, 4)
    with pytest.raises(ValidationError, match="output.head is not read by task 'image'"):
        entry(task="image", output={"head": "yolo"})
    with pytest.raises(ValidationError, match="give task: explicitly"):
        entry(output={"range": "unit"})
    with pytest.raises(ValidationError):
        entry(task="paint")


def test_the_outputs_tell_the_task_where_the_entry_does_not():
    c = card()
    assert resolve_task(entry(), c, outs((10,))).kind == "classify"
    img = resolve_task(entry(), c, outs((3, 64, 64)))
    assert (img.kind, img.layout, img.scale, img.shift) == (
        "image",
        "nchw",
        (63.75,) * 3,
        (127.5,) * 3,
    )
    assert resolve_task(entry(), c, outs((64, 64, 3))).layout == "nhwc"
    assert resolve_task(entry(), c, outs((21, 64, 64))).kind == "segment"
    ssd = resolve_task(entry(), c, outs((100, 4), (100, 7)))
    assert (ssd.kind, ssd.head, ssd.outputs, ssd.channels, ssd.normalized) == (
        "detect",
        "ssd",
        (0, 1),
        7,
        True,
    )
    assert resolve_task(entry(), c, outs((5, 7, 9))).kind == "tensors"


def test_a_named_task_is_checked_against_the_outputs():
    c = card()
    bad = {
        "classify": ((3, 64, 64),),
        "image": ((5, 64, 64),),
        "segment": ((300, 64, 64),),
        "detect": ((10, 5),),
    }
    for task, shapes in bad.items():
        with pytest.raises(InvalidInput) as err:
            resolve_task(entry(task=task), c, outs(*shapes))
        assert err.value.fields["model"] == "m"
    yolo = resolve_task(entry(task="detect"), c, outs((32, 7)))
    assert (yolo.head, yolo.channels, yolo.box_format, yolo.normalized) == (
        "yolo",
        2,
        "cxcywh",
        False,
    )
    with pytest.raises(InvalidInput, match="one anchor a box"):
        resolve_task(entry(task="detect", output={"anchors": [[0, 0, 1, 1]]}), c, outs((32, 7)))
    with pytest.raises(InvalidInput, match="no output of that name"):
        resolve_task(entry(task="image", output={"name": "nope"}), c, outs((3, 64, 64)))
    rgb_mean = card(mean=(0.4, 0.5, 0.6))
    with pytest.raises(InvalidInput, match="give output.mean"):
        resolve_task(entry(task="image"), rgb_mean, outs((1, 64, 64)))
    grey = resolve_task(entry(task="image", output={"range": "unit"}), rgb_mean, outs((1, 64, 64)))
    assert (grey.channels, grey.scale, grey.shift) == (1, (255.0,), (0.0,))


def test_a_requests_options_and_what_they_refuse():
    o = parse_options("image", {"quality": "70", "size": "model"}, None)
    assert (o.quality, o.size, o.media_type) == (70, "model", None)
    assert for_image(o, 10, 20, "jpeg").media_type == "image/jpeg"
    assert for_image(o, 10, 20, "png").source == (10, 20)
    assert negotiate("image/webp;q=0.5, image/png") == "image/png"
    assert negotiate("image/gif, */*;q=0.1") is None
    with pytest.raises(NotAcceptable):
        negotiate("image/gif, text/html")
    d = parse_options("detect", {"score_threshold": "0", "max_boxes": "5"}, None)
    assert (d.score_threshold, d.iou_threshold, d.max_boxes) == (0.0, 0.45, 5)
    for kind, q in (
        ("image", {"quality": "101"}),
        ("image", {"size": "big"}),
        ("segment", {"format": "gif"}),
        ("detect", {"iou_threshold": "nan"}),
        ("detect", {"top_k": "3"}),
    ):
        with pytest.raises(InvalidInput):
            parse_options(kind, q, None)


def test_the_answers_memory_is_checked_before_it_is_admitted():
    task = resolve_task(entry(task="image"), card(), outs((3, 64, 64)))
    small = for_image(parse_options("image", {}, None), 480, 640, "png")
    check_work(task, small, 64 << 20)
    big = for_image(parse_options("image", {}, None), 4000, 6000, "png")
    with pytest.raises(PayloadTooLarge) as err:
        check_work(task, big, 64 << 20)
    assert err.value.fields["answer_height"] == 4000
    check_work(
        task,
        for_image(parse_options("image", {"size": "model"}, None), 4000, 6000, "png"),
        64 << 20,
    )


def test_boxes_decode_from_anchors_and_map_back_through_each_resize():
    e = entry(task="detect", output={"head": "ssd", "anchors": [[0.5, 0.5, 0.2, 0.4]]})
    task = resolve_task(e, card(), outs((1, 4), (1, 3)))
    d = np.array([[[1.0, -1.0, 0.0, np.log(2) / 0.2]]], np.float32)
    b = decode_boxes(task, d, anchors_of(e))[0, 0] / 64  # back on the [0, 1] scale
    # cx = .5 + 1 * .1 * .2, cy = .5 - .1 * .4, w = .2, h = .4 * 2
    np.testing.assert_allclose(b, [0.42, 0.06, 0.62, 0.86], atol=1e-6)
    yolo = resolve_task(entry(task="detect"), card(resize="fit"), outs((4, 7)))
    box = np.array([[0, 16, 64, 48]], np.float64)  # the whole letterboxed 2:1 image
    np.testing.assert_allclose(to_source(yolo, box, (100, 200)), [[0, 0, 200, 100]])
    crop = resolve_task(entry(task="detect"), card(resize="crop"), outs((4, 7)))
    # a 128x128 image, cropped: resized to 73x73 (64 / 0.875), its centre 64x64 kept
    got = to_source(crop, np.array([[0, 0, 64, 64]], np.float64), (128, 128))
    np.testing.assert_allclose(got, [[4 * 128 / 73, 4 * 128 / 73, 68 * 128 / 73, 68 * 128 / 73]])


def test_ssd_scores_skip_the_background_and_nms_keeps_the_best():
    e = entry(task="detect", output={"background": 0, "activation": "softmax"})
    task = resolve_task(e, card(), outs((3, 4), (3, 3)))
    boxes = np.array([[[0, 0, 0.5, 0.5], [0, 0, 0.5, 0.49], [0.5, 0.5, 1, 1]]], np.float32)
    logits = np.array([[[0, 5, 0], [0, 4, 0], [9, 0, 1]]], np.float32)  # 3rd: background
    opts = [for_image(parse_options("detect", {}, None), 128, 128, "png")]
    (d,) = detections(task, (boxes, logits), None, opts, str)
    assert [(b["box"], b["class"]) for b in d["boxes"]] == [([0.0, 0.0, 64.0, 64.0], 1)]


def stage(models: list[dict]) -> PostprocessStage:
    cfg = PipelineConfig.model_validate(
        {"models": models, "executor": {"backend": "numpy", "buckets": [1, 2]}}
    )
    return PostprocessStage(cfg)


def test_the_postprocess_stage_answers_a_mixed_call(tmp_path):
    s = stage([{"name": "m", "engine": "onnx", "source": "/m.onnx", "task": "image"}])
    task = resolve_task(s_entry := entry(task="image"), card(), outs((3, 8, 8)))
    assert s_entry.task == "image"
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)
    x[1, 0, 0, 0] = np.nan
    opts = for_image(parse_options("image", {"size": "model"}, None), 8, 8, "png")
    spec = PostSpec("image", task=task, options=opts)
    logits = Logits(4, [0, 1, 3], data=x, row_times=RowTimes([1.0] * 3, [2.0] * 3, [3] * 3))
    a, bad, c, d = s.run("m", logits, [spec, spec, PostSpec("classify"), spec])
    assert isinstance(bad, NonFiniteOutput)
    assert isinstance(c, InvalidInput) and "classify" in str(c)  # the task's own route
    for got, row in ((a, 0), (d, 2)):
        img = np.asarray(Image.open(io.BytesIO(got.media)))
        want = np.clip(np.rint(x[row].transpose(1, 2, 0) * 63.75 + 127.5), 0, 255)
        assert got.media_type == "image/png" and (img == want).all() and got.batch_size == 3


def test_a_task_models_encoded_view_answers_bytes_rows():
    from pipeline.protocol import encoded

    meta = encoded.task_metadata("m_encoded", {"name": "m", "outputs": [{"name": "y"}]}, "image")
    assert meta["inputs"][0]["datatype"] == "BYTES" and meta["outputs"] == [
        {"name": "image", "datatype": "BYTES", "shape": [-1, 1]}
    ]
    query, accept = encoded.task_query({"quality": 80, "accept": "image/png", "priority": 1})
    assert (query, accept) == ({"quality": "80"}, "image/png")
    body = {"media": b"\x89PNG..", "timings_ms": {}, "batch_size": 1, "random_weights": False}
    row = encoded.task_outputs("image", body, frozenset())["outputs"]["image"]
    assert row.shape == (1, 1) and row[0, 0] == b"iVBORy4u"  # base64 in JSON
    raw = encoded.task_outputs("image", body, frozenset({"image"}))["outputs"]["image"]
    assert raw[0, 0] == b"\x89PNG.."
    boxes = encoded.task_outputs(
        "detect", {**body, "media": None, "result": {"boxes": []}}, frozenset()
    )
    assert boxes["outputs"]["boxes"][0, 0] == b'{"boxes":[]}'


def test_a_model_whose_outputs_do_not_fit_its_task_is_refused_when_it_loads(tmp_path):
    onnx = pytest.importorskip("onnx")
    from pipeline.executor import GpuExecutor
    from pipeline.models.loading import load_models
    from tests.onnx_models import small_net

    src = str(tmp_path / "small.onnx")
    onnx.save(small_net(), src)
    cfg = PipelineConfig.model_validate(
        {
            "models": [
                {"name": "ok", "engine": "onnx", "source": src},
                {"name": "wrong", "engine": "onnx", "source": src, "task": "segment"},
            ],
            "executor": {"backend": "numpy", "buckets": [1]},
        }
    )
    report = load_models(GpuExecutor(cfg.executor), cfg, warm=False)
    assert report.loaded == ["ok"] and "task segment" in report.refused["wrong"]
    assert "[N, C, H, W]" in report.refused["wrong"]


def test_a_route_of_another_task_is_refused_naming_the_models_own():
    from deployments.task_routes import TaskRoutes

    class Front(TaskRoutes):
        def __init__(self, models, tasks):
            self.models, self.tasks = models, tasks

    told = {"img": entry(task="image"), "v2": entry(task="tensors"), "any": entry()}
    f = Front(told, {"any": resolve_task(entry(), card(), outs((5, 7, 9)))})
    f.check_route("img", "image")
    with pytest.raises(InvalidInput) as err:
        f.check_route("img", "classify")
    assert err.value.fields["route"] == "/v1/models/img/image"
    with pytest.raises(InvalidInput) as err:
        f.check_route("v2", "classify")  # named tensors: v2 only
    assert err.value.fields["route"] == "/v2 infer"
    f.check_route("any", "classify")  # told tensors by its outputs: classify says what it can
    with pytest.raises(InvalidInput):
        f.check_route("any", "detect")


def test_the_part_of_the_output_an_answer_is_made_of():
    from pipeline.tasks.answers import window
    from pipeline.tasks.options import answer_size

    box = resolve_task(entry(task="image"), card(resize="fit"), outs((3, 128, 128)))
    # a 100x200 image letterboxed into 64x64 is rows 16..48; the output is twice the size
    assert window(box, (100, 200)) == (32, 0, 64, 128)
    opts = for_image(parse_options("image", {}, None), 100, 200, "png")
    assert answer_size(box, opts) == (100, 200)
    crop = resolve_task(entry(task="image"), card(resize="crop"), outs((3, 64, 64)))
    # a centre crop covers 64 of 73 resized pixels: the answer is the source under it
    assert answer_size(crop, for_image(opts, 146, 146, "png")) == (128, 128)


@pytest.mark.parametrize("resize", ["stretch", "fit", "crop"])
def test_class_areas_are_counted_on_the_models_mask_as_on_the_answered_one(resize):
    """``format=json``'s areas, counted on the model's mask with each pixel weighted by the
    answer pixels it becomes, are the counts of the mask a PNG answer would carry."""
    from pipeline.tasks.answers import TaskContext, _areas_of, _mask_back

    task = resolve_task(entry(task="segment"), card(resize=resize), outs((5, 64, 64)))
    ctx = TaskContext({"m": str})
    rng = np.random.default_rng(1)
    for h, w in ((64, 64), (100, 200), (480, 640), (37, 301), (1080, 1920)):
        mask = rng.integers(0, 5, (64, 64), dtype=np.uint8)
        mask[10:30, 5:50] = 3  # a region, beside the noise
        o = for_image(parse_options("segment", {"format": "json"}, None), h, w, "png")
        back = _mask_back(task, mask, o)
        counts = np.bincount(back.ravel(), minlength=5)
        got = _areas_of(ctx, task, mask, o)
        assert (got["height"], got["width"]) == back.shape
        assert {c["class"]: c["pixels"] for c in got["classes"]} == {
            c: int(n) for c, n in enumerate(counts) if n
        }
