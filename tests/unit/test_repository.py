"""The model repository: entries validated at startup, cards, v2 requests by the model's specs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from pipeline.check import ConfigCheckFailed, check
from pipeline.config import ExecutorConfig, ModelConfig, PipelineConfig
from pipeline.engines.base import TensorInfo
from pipeline.errors import InvalidInput
from pipeline.executor import GpuExecutor
from pipeline.imaging import Target, fit
from pipeline.models.repository import load_entry, model_card, random_weights
from pipeline.protocol.v2 import Signature, model_metadata, parse_infer


def test_builtins_are_ordinary_entries_and_the_arch_spelling_still_works():
    a = ModelConfig(name="r", arch="resnet50")
    b = ModelConfig(name="r", source="resnet50")
    assert a.engine == b.engine == "native" and a.source == b.source == "resnet50"
    card = model_card(b)
    assert card.target() == Target(224, 224, 3, "center_crop") and len(card.labels) == 1000
    assert card.input_dtype == "uint8" and random_weights(b)
    d = model_card(ModelConfig(name="d", source="digits"))
    assert d.target() == Target(8, 8, 1, "stretch") and d.label(3) == "3"
    assert not random_weights(ModelConfig(name="d", source="digits"))


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "source": "vgg99"}, "the native engine builds"),
        ({"name": "x"}, "a source is required"),
        ({"name": "x", "engine": "torch", "source": "pkg.mod:1fn"}, "neither a file nor"),
        ({"name": "x", "source": "digits", "arch": "resnet50"}, "arch or source"),
        ({"name": "bad name!", "source": "digits"}, "name"),
        ({"name": "x", "source": "digits", "input": {"channels": 3, "mean": [0.5]}}, "mean"),
        ({"name": "x", "source": "digits", "input": {"resize": "squash"}}, "resize"),
    ],
)
def test_bad_entries_fail_validation_naming_the_reason(entry, message):
    with pytest.raises(ValidationError, match=message):
        ModelConfig.model_validate(entry)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "engine": "tensorrt", "source": "a"}, "unknown engine 'tensorrt'"),
        ({"name": "x", "engine": "torch", "source": "/no/such/model.pt2"}, "source file not found"),
        ({"name": "x", "engine": "onnx", "source": "missing.onnx"}, "source file not found"),
        ({"name": "x", "source": "digits", "labels": "/no/labels.txt"}, "labels file not found"),
    ],
)
def test_entries_their_engines_or_files_refuse_fail_the_check_naming_the_reason(entry, message):
    with pytest.raises(ConfigCheckFailed, match=message):
        check(PipelineConfig(models=[ModelConfig.model_validate(entry)]))


def test_labels_files_are_read_and_checked(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n# nothing\n")
    with pytest.raises(ConfigCheckFailed, match="has no labels"):
        check(PipelineConfig(models=[ModelConfig(name="d", source="digits", labels=str(empty))]))
    ten = tmp_path / "ten.txt"
    ten.write_text("".join(f"digit {i}\n" for i in range(10)))
    e = ModelConfig(name="d", source="digits", labels=str(ten))
    assert model_card(e).label(7) == "digit 7"
    load_entry(e)  # 10 labels for 10 classes
    three = tmp_path / "three.txt"
    three.write_text("a\nb\nc\n")
    with pytest.raises(InvalidInput, match="labels file does not match"):
        load_entry(ModelConfig(name="d", source="digits", labels=str(three)))


def test_an_engine_not_there_yet_is_a_valid_choice_that_fails_at_load(tmp_path, monkeypatch):
    from pipeline.engines import ENGINES

    monkeypatch.setitem(ENGINES, "future", "pipeline.engines.future:build")
    f = tmp_path / "m.onnx"
    f.write_bytes(b"\x08\x07")
    e = ModelConfig(name="m", engine="future", source=str(f))  # valid in the config
    with pytest.raises(InvalidInput, match="the future engine is not available yet"):
        load_entry(e)


def test_input_defaults_and_overrides():
    e = ModelConfig(name="t", engine="torch", source="resnet18")
    i = model_card(e).image
    assert (i.height, i.width, i.channels, i.layout, i.resize) == (224, 224, 3, "nchw", "crop")
    e = ModelConfig(
        name="t",
        engine="torch",
        source="resnet18",
        input={"height": 96, "width": 128, "channels": 1, "mean": [0.5], "resize": "fit"},
    )
    i = model_card(e).image
    assert (i.height, i.width, i.channels, i.mean) == (96, 128, 1, (0.5,))
    assert model_card(e).target().fit == "letterbox"
    with pytest.raises(InvalidInput, match="fixed input size"):
        model_card(ModelConfig(name="d", source="digits", input={"height": 9}))


def test_letterbox_fits_the_whole_image_inside_and_pads():
    img = np.full((50, 100, 3), 200, np.uint8)
    out = fit(img, Target(64, 64, 3, "letterbox"))
    assert out.shape == (64, 64, 3)
    assert (out[:16] == 0).all() and (out[-16:] == 0).all() and (out[16:48] == 200).all()


def test_max_batch_bounds_a_models_buckets_and_is_checked():
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 2, 4, 8)))
    ex.load_entry(ModelConfig(name="d", source="digits", max_batch=4))
    assert ex.buckets("d") == (1, 2, 4)
    x = np.zeros((6, 8, 8, 1), np.uint8)
    assert ex.infer("d", x).shape == (6, 10)  # split at the model's largest bucket
    with pytest.raises(InvalidInput, match="larger than the largest bucket"):
        ex.prepare("d", 5)
    ex.close()
    with pytest.raises(ValidationError, match="below the smallest bucket"):
        PipelineConfig(
            models=[{"name": "d", "source": "digits", "max_batch": 1}],
            executor={"buckets": [2, 4]},
        )


TORCH_SIG = Signature(
    (TensorInfo("input", "float32", (-1, 3, 4, 4)),),
    (TensorInfo("logits", "float32", (-1, 5)),),
)
DIGITS_SIG = Signature(
    (TensorInfo("image", "uint8", (-1, 8, 8, 1)),), (TensorInfo("logits", "float32", (-1, 10)),)
)


def _req(shape, datatype, data, outputs=None, name="input"):
    body = {"inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]}
    if outputs is not None:
        body["outputs"] = [{"name": o} for o in outputs]
    return json.dumps(body).encode()


def test_v2_takes_the_models_own_tensor_by_dtype_and_shape():
    x = np.arange(2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4) / 7
    r = parse_infer(_req([2, 3, 4, 4], "FP32", x.ravel().tolist()), None, TORCH_SIG, 8)
    np.testing.assert_array_equal(r.images, x)
    assert r.outputs == ("logits", "probabilities")  # every output, and the softmax
    with pytest.raises(InvalidInput, match="datatype does not match") as info:
        parse_infer(_req([2, 3, 4, 4], "UINT8", [0] * 96), None, TORCH_SIG, 8)
    assert info.value.fields["expected"] == "FP32"
    with pytest.raises(InvalidInput, match="shape does not match") as info:
        parse_infer(_req([2, 4, 4, 3], "FP32", [0.0] * 96), None, TORCH_SIG, 8)
    assert info.value.fields["expected"] == [-1, 3, 4, 4]
    with pytest.raises(InvalidInput, match="unknown output"):
        parse_infer(_req([1, 3, 4, 4], "FP32", [0.0] * 48, ["features"]), None, TORCH_SIG, 8)
    with pytest.raises(InvalidInput, match="batch size out of range"):
        parse_infer(_req([9, 3, 4, 4], "FP32", [0.0] * 9 * 48), None, TORCH_SIG, 8)
    # a UINT8 model also takes pixel values as floats, as before
    r = parse_infer(_req([1, 8, 8, 1], "FP32", [3.0] * 64, name="image"), None, DIGITS_SIG, 8)
    assert r.images.dtype == np.uint8 and (r.images == 3).all()


@pytest.mark.parametrize("name", ["bogus", "", None, 7])
def test_v2_refuses_an_input_name_the_model_does_not_have_listing_its_names(name):
    body = {"inputs": [{"shape": [1, 8, 8, 1], "datatype": "UINT8", "data": [0] * 64}]}
    if name is not None:
        body["inputs"][0]["name"] = name
    with pytest.raises(InvalidInput) as info:
        parse_infer(json.dumps(body).encode(), None, DIGITS_SIG, 8)
    assert info.value.http_status == 400
    assert str(info.value.message).startswith("unknown input ")
    assert info.value.message.endswith("; the model's inputs: image")
    assert info.value.fields["inputs"] == ["image"]
    if name == "bogus":
        assert info.value.message == "unknown input 'bogus'; the model's inputs: image"
        assert info.value.fields["input"] == "bogus"


def test_v2_refuses_an_output_name_the_model_does_not_have_listing_its_names():
    body = _req([1, 8, 8, 1], "UINT8", [0] * 64, ["logits", "bogus"], name="image")
    with pytest.raises(InvalidInput) as info:
        parse_infer(body, None, DIGITS_SIG, 8)
    assert info.value.message == (
        "unknown output 'bogus'; the model's outputs: logits, probabilities"
    )
    assert info.value.fields == {"output": "bogus", "outputs": ["logits", "probabilities"]}


def test_v2_metadata_tells_the_real_specs():
    meta = model_metadata("m", TORCH_SIG, "torch")
    assert meta["platform"] == "torch"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 4, 4]}]
    assert [o["name"] for o in meta["outputs"]] == ["logits", "probabilities"]
