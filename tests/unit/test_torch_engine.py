"""The torch engine on the CPU (eager torch): every source kind, both feeds, its checks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pipeline.config import ExecutorConfig, ModelConfig  # noqa: E402
from pipeline.errors import InvalidInput  # noqa: E402
from pipeline.executor import GpuExecutor  # noqa: E402
from pipeline.models.repository import model_card  # noqa: E402
from tests.models.small_torch import small_net, two_heads  # noqa: E402

SMALL = {"height": 16, "width": 16}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    d = tmp_path_factory.mktemp("torch_sources")
    m = small_net()
    x = torch.zeros(1, 3, 16, 16)
    ts = str(d / "small.pt")
    torch.jit.trace(m, x).save(ts)
    pt2 = str(d / "small.pt2")
    batch = torch.export.Dim("batch", min=1, max=4096)
    x2 = torch.zeros(2, 3, 16, 16)
    torch.export.save(torch.export.export(m, (x2,), dynamic_shapes=({0: batch},)), pt2)
    fixed = str(d / "fixed.pt2")
    torch.export.save(torch.export.export(m, (x,)), fixed)
    return {
        "script": ts,
        "export": pt2,
        "function": "tests.models.small_torch:small_net",
        "fixed": fixed,
    }


def _executor():
    return GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 2, 4), max_in_flight=2))


def _normalised(u8: np.ndarray) -> torch.Tensor:
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return (torch.from_numpy(u8).permute(0, 3, 1, 2).float() / 255 - mean) / std


@pytest.mark.parametrize("kind", ["script", "export", "function"])
def test_every_source_serves_both_feeds_as_torch_computes_them(sources, kind):
    entry = ModelConfig(
        name="m", engine="torch", source=sources[kind], input=SMALL if kind != "export" else {}
    )
    ex = _executor()
    loaded = ex.load_entry(entry)
    eng = loaded.engine
    assert eng.name == "torch" and not loaded.random_weights
    assert [(t.name, t.dtype, t.shape) for t in eng.inputs] == [
        ("input", "float32", (-1, 3, 16, 16))
    ]
    assert [(t.name, t.shape) for t in eng.outputs] == [("logits", (-1, 5))]
    ref = small_net()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 3, 16, 16)).astype(np.float32)
    got = ex.infer("m", x, feed="tensors")
    with torch.inference_mode():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    u8 = rng.integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    got = ex.infer("m", u8)  # the image feed: uint8 NHWC, normalised before the model
    with torch.inference_mode():
        want = ref(_normalised(u8)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    p = eng.plan(4, "tensors")
    assert p.inputs[0].shape == (4, 3, 16, 16) and p.outputs[0].shape == (4, 5)
    assert p.arena_bytes >= 4 * 3 * 16 * 16 * 4 + 4 * 5 * 4 and p.flops > 0
    ex.close()


def test_export_archive_declares_its_input(sources):
    card = model_card(ModelConfig(name="m", engine="torch", source=sources["export"]))
    assert (card.image.height, card.image.width, card.image.channels) == (16, 16, 3)
    assert card.image.layout == "nchw" and card.input_dtype == "float32"


def test_a_model_of_several_outputs_returns_each_by_name():
    ex = _executor()
    ex.load_entry(
        ModelConfig(
            name="h", engine="torch", source="tests.models.small_torch:two_heads", input=SMALL
        )
    )
    eng = ex.models["h"].engine
    assert [(t.name, t.shape) for t in eng.outputs] == [("scores", (-1, 5)), ("features", (-1, 8))]
    x = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype(np.float32)
    scores, feats = _run(ex, x)
    with torch.inference_mode():
        y = two_heads()(torch.from_numpy(x))
    np.testing.assert_allclose(scores, y["scores"].numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(feats, y["features"].numpy(), rtol=1e-4, atol=1e-5)
    ex.close()


def _run(ex, x):
    p = ex.prepare("h", len(x), feed="tensors")
    return ex.commit(p, x).wait(10)


def test_sources_that_cannot_be_served_fail_at_load_with_the_reason(sources, tmp_path):
    ex = _executor()
    with pytest.raises(InvalidInput, match="must return a torch.nn.Module"):
        ex.load_entry(
            ModelConfig(name="x", engine="torch", source="tests.models.small_torch:not_a_module")
        )
    with pytest.raises(InvalidInput, match="does not run on its declared input"):
        ex.load_entry(  # the exported program is for 16x16
            ModelConfig(
                name="x",
                engine="torch",
                source=sources["export"],
                input={"height": 32, "width": 32},
            )
        )
    with pytest.raises(InvalidInput, match="fixed batch size"):
        ex.load_entry(ModelConfig(name="x", engine="torch", source=sources["fixed"]))
    bad = tmp_path / "broken.pt"
    bad.write_bytes(b"not a torchscript file")
    with pytest.raises(InvalidInput, match="cannot load the model"):
        ex.load_entry(ModelConfig(name="x", engine="torch", source=str(bad)))
    labels = tmp_path / "labels.txt"
    labels.write_text("a\nb\nc\n")
    with pytest.raises(InvalidInput, match="labels file does not match") as info:
        ex.load_entry(
            ModelConfig(
                name="x", engine="torch", source=sources["script"], input=SMALL, labels=str(labels)
            )
        )
    assert info.value.fields["labels"] == 3 and info.value.fields["classes"] == 5
    assert "x" not in ex.models
    ex.close()


def test_past_its_warm_up_a_torch_model_is_not_captured_on_a_new_arena(sources):
    """``Engine.late_capture``: after its warm-up a batch of a torch model on an arena new to
    its bucket runs eagerly (torch's capture syncs the device and collects garbage), while a
    native model's may still be captured; an unloaded model starts over."""
    ex = _executor()
    ex.load_entry(ModelConfig(name="t", engine="torch", source=sources["function"], input=SMALL))
    ex.load_model("digits", "digits")
    mode = ex.mode
    assert mode._may_capture("t") and mode._may_capture("digits")  # the warm-up captures
    ex.warmup()
    assert not mode._may_capture("t") and mode._may_capture("digits")
    assert ex.models["t"].engine.late_capture is False
    assert ex.models["digits"].engine.late_capture is True
    ex.unload("t")
    assert "t" not in mode._settled
    ex.close()


def test_compile_dynamic_is_the_torch_engines_option_and_the_cpu_runs_eager(sources):
    with pytest.raises(ValueError, match="compile is the torch engine's option"):
        ModelConfig(name="n", source="resnet50", compile="dynamic")
    entry = ModelConfig(
        name="m", engine="torch", source=sources["function"], input=SMALL, compile="dynamic"
    )
    ex = _executor()
    eng = ex.load_entry(entry).engine
    assert not eng.dynamic  # nothing is compiled on the CPU: eager torch, as before
    x = np.random.default_rng(2).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    with torch.inference_mode():
        want = small_net()(_normalised(x)).numpy()
    np.testing.assert_allclose(ex.infer("m", x), want, rtol=1e-4, atol=1e-5)
    ex.close()


@pytest.mark.skipif(
    not __import__("shutil").which("g++"), reason="inductor on the CPU needs a C++ compiler"
)
def test_the_dynamic_marks_make_one_compile_serve_every_batch_from_two():
    """What ``compile: dynamic`` compiles (on a GPU), run here by inductor on the CPU: the
    joined function's marks let one compile serve batches 2 to 7 -- batch 1 compiles apart --
    where a static compile makes one for each size."""
    from torch._dynamo.utils import counters

    from pipeline.engines.torch_engine import TorchEngine

    def compiles(dynamic: bool) -> int:
        torch._dynamo.reset()
        eng = TorchEngine.__new__(TorchEngine)
        eng.dynamic = dynamic
        net = small_net().eval()
        fn = eng._joined(
            lambda x: x.float() / 255, torch.compile(net, dynamic=None if dynamic else False), True
        )
        before = counters["stats"]["unique_graphs"]
        with torch.inference_mode():
            for b in (1, 2, 3, 5, 7):
                x = torch.randint(0, 256, (b, 3, 16, 16), dtype=torch.uint8)
                torch.testing.assert_close(fn(x), net(x.float() / 255), rtol=1e-4, atol=1e-4)
        return counters["stats"]["unique_graphs"] - before

    dynamic, static = compiles(True), compiles(False)
    assert static == 2 * 5  # prep and module, each batch size
    assert dynamic == 2 * 2, dynamic  # each: batch 1, then one for 2..7
