"""The ``onnx`` engine behind the executor on the CPU: the model's own float32 tensors by the
file's names (``tensors`` feed) and uint8 images normalised inside (``image`` feed), padded
to buckets, every output by name, against onnx's ReferenceEvaluator -- on both backends:
Ferry's native graph, and the graph lowered to torch (eager here)."""

from __future__ import annotations

import importlib.util
import logging
from types import SimpleNamespace

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx.reference import ReferenceEvaluator  # noqa: E402

from pipeline.config import ExecutorConfig  # noqa: E402
from pipeline.engines import builder  # noqa: E402
from pipeline.engines.base import ImageInput  # noqa: E402
from pipeline.errors import InvalidInput, ModelRefused  # noqa: E402
from pipeline.executor import GpuExecutor  # noqa: E402
from pipeline.importers.onnx_graph import load_onnx  # noqa: E402
from pipeline.importers.onnx_lower import NotLowered, lower  # noqa: E402
from tests.onnx_models import Builder, single_relu_lrn, small_net, tensor  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


BACKENDS = [
    "native",
    pytest.param(  # the graph lowered to torch, eager on the CPU (the GPU's: tests/gpu)
        "torch",
        marks=pytest.mark.skipif(
            importlib.util.find_spec("torch") is None, reason="the torch backend needs torch"
        ),
    ),
]


@pytest.fixture(scope="module", params=BACKENDS)
def served(tmp_path_factory, request):
    model = small_net()
    path = str(tmp_path_factory.mktemp("onnx") / "small.onnx")
    onnx.save(model, path)
    entry = SimpleNamespace(name="small", source=path, backend=request.param)
    loaded = builder("onnx")(entry, ImageInput(16, 16, 3, MEAN, STD))
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 4)))
    ex.load(loaded)
    ex.warmup()
    assert loaded.engine.why.startswith(request.param), loaded.engine.why
    yield ex, loaded, ReferenceEvaluator(model)
    ex.close()


def test_auto_is_native_on_the_cpu(tmp_path):
    path = str(tmp_path / "small.onnx")
    onnx.save(small_net(), path)
    loaded = builder("onnx")(
        SimpleNamespace(name="s", source=path), ImageInput(16, 16, 3, MEAN, STD)
    )
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1,)))
    try:
        ex.load(loaded)
        assert loaded.engine.impl is loaded.engine.native
        assert loaded.engine.why == "native (auto, target host)"
    finally:
        ex.close()


def test_signature_comes_from_the_file(served):
    _ex, loaded, _ref = served
    eng = loaded.engine
    assert [(t.name, t.dtype, t.shape) for t in eng.inputs] == [("x", "float32", (-1, 3, 16, 16))]
    assert [(t.name, t.shape) for t in eng.outputs] == [("logits", (-1, 10)), ("prob", (-1, 10))]
    assert set(eng.feeds) == {"tensors", "image"}


@pytest.mark.parametrize("n", [1, 3])
def test_tensors_feed_matches_the_reference(served, n):
    ex, _loaded, ref = served
    x = np.random.default_rng(n).standard_normal((n, 3, 16, 16)).astype(np.float32)
    got = ex.commit(ex.prepare("small", n, feed="tensors"), x).wait(30)
    want = ref.run(None, {"x": x})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_image_feed_normalises_inside(served):
    ex, _loaded, ref = served
    img = np.random.default_rng(7).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
    got = ex.commit(ex.prepare("small", 2, feed="image"), img).wait(30)
    x = ((img / 255.0 - np.array(MEAN)) / np.array(STD)).transpose(0, 3, 1, 2).astype(np.float32)
    for a, b in zip(got, ref.run(None, {"x": x}), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_an_image_input_that_does_not_fit_is_refused_at_load(tmp_path):
    path = str(tmp_path / "small.onnx")
    onnx.save(small_net(), path)
    with pytest.raises(InvalidInput) as info:
        builder("onnx")(SimpleNamespace(name="s", source=path), ImageInput(32, 32, 3, MEAN, STD))
    assert info.value.fields["model_input"] == (-1, 3, 16, 16)


def test_an_unsupported_op_is_refused_when_the_model_loads(tmp_path):
    path = str(tmp_path / "lrn.onnx")
    onnx.save(single_relu_lrn(), path)
    with pytest.raises(ModelRefused) as info:
        builder("onnx")(SimpleNamespace(name="lrn", source=path), None)
    assert info.value.fields["op"] == "LRN"


def test_infer_of_a_model_with_two_outputs_gives_both(served):
    ex, _loaded, ref = served
    x = np.random.default_rng(9).standard_normal((6, 3, 16, 16)).astype(np.float32)  # 4 + 2
    logits, prob = ex.infer("small", x, feed="tensors")
    want = ref.run(None, {"x": x})
    np.testing.assert_allclose(logits, want[0], rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(prob, want[1], rtol=1e-3, atol=1e-5)


def test_classify_cli_on_an_onnx_file(tmp_path):
    import json
    import subprocess
    import sys

    import skimage.data

    from pipeline.imaging import encode_jpeg

    path, img = tmp_path / "small.onnx", tmp_path / "cat.jpg"
    onnx.save(small_net(), str(path))
    img.write_bytes(encode_jpeg(skimage.data.chelsea()))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline",
            "classify",
            str(img),
            "--model-file",
            str(path),
            "--engine",
            "onnx",
            "--top-k",
            "3",
            "--json",
            "--backend",
            "numpy",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    top = json.loads(out.stdout)["top_k"]
    assert len(top) == 3 and top[0]["score"] >= top[1]["score"] >= top[2]["score"]


def _edge_pad_on_channels():
    """[N, 3, 4, 4] -> Pad edge along the channels -> mean -> [N, 6]: Ferry's graph runs it;
    torch pads only the trailing spatial axes in that mode, so the lowering refuses it."""
    b = Builder(0)
    y = b.node("Pad", ["x", b.const(np.array([0, 1, 0, 0, 0, 2, 0, 0], np.int64))], mode="edge")
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)
    b.nodes[-1].output[0] = "y"
    return b.model([tensor("x", ["batch", 3, 4, 4])], [tensor("y", ["batch", 6])])


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the lowering needs torch")
def test_a_node_the_lowering_cannot_take(tmp_path, caplog):
    path = str(tmp_path / "pad.onnx")
    onnx.save(_edge_pad_on_channels(), path)
    image = ImageInput(4, 4, 3, MEAN, STD)
    with pytest.raises(NotLowered, match="Pad"):
        lower(load_onnx(path))
    forced = builder("onnx")(SimpleNamespace(name="p", source=path, backend="torch"), image)
    host = SimpleNamespace(target="host")
    with pytest.raises(ModelRefused) as info:
        forced.engine._pick(host)
    assert "Pad" in info.value.fields["why"]
    # auto on a GPU target: the native graph, with one warning naming the node
    auto = builder("onnx")(SimpleNamespace(name="p", source=path), image).engine
    with caplog.at_level(logging.WARNING, logger="pipeline.engines.onnx"):
        assert auto._pick(SimpleNamespace(target="cuda")) is auto.native
    assert auto.why.startswith("native: ") and "Pad" in auto.why, auto.why
    assert "onnx backend native, not torch" in caplog.text


def test_the_file_is_the_compile_gates_key_and_an_engine_made_without_one_has_none(tmp_path):
    from pipeline.engines.onnx import OnnxEngine

    path = str(tmp_path / "pad.onnx")
    onnx.save(_edge_pad_on_channels(), path)
    image = ImageInput(4, 4, 3, MEAN, STD)
    built = builder("onnx")(SimpleNamespace(name="p", source=path), image).engine
    assert built.gate_key.startswith(f"onnx:{path}:")
    assert OnnxEngine("p", load_onnx(path), image).gate_key is None  # no gate, no error
    assert built.late_capture is True  # its native graph's (a lowering to torch: torch's)
