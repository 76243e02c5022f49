"""Each model's compute dtype, decided once at load (``pipeline/executor_precision.py``), on
numpy with ``executor.dtype: float16`` forced (numpy computes in float16 as cupy does): a
model whose activations overflow float16 serves in float32 with one WARNING and finite
answers; normal models stay in float16; the entry's ``precision`` overrides the probe (and
a forced float16 overflow is a NonFiniteOutput, never a NaN score); the rule itself; the
probe's order of loads; the torch engine's trial on the CPU; where a user sees it."""

from __future__ import annotations

import asyncio
import json
import logging
import math

import numpy as np
import pytest
import yaml

from deployments import readiness as rd
from deployments.cli import main
from pipeline.config import PipelineConfig
from pipeline.device import Stream
from pipeline.engines.base import Engine, EngineContext, ImageInput, TensorInfo, probe_input
from pipeline.engines.torch_engine import TorchEngine
from pipeline.errors import NonFiniteOutput
from pipeline.executor import GpuExecutor
from pipeline.executor_precision import FP16_TOLERANCE, MEASURE, Precision, choose, fp16_error
from pipeline.imaging import encode_png
from pipeline.models.loading import load_models
from pipeline.models.repository import model_card
from pipeline.ops.base import TensorSpec
from pipeline.stages.build import build_inference
from pipeline.stages.messages import Answer, Encoded, PostSpec, RequestMeta

onnx = pytest.importorskip("onnx")

from onnx.reference import ReferenceEvaluator  # noqa: E402

from tests.onnx_models import overflow_net, small_net  # noqa: E402
from tests.unit import virtual_time  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("precision")
    onnx.save(overflow_net(), str(d / "over.onnx"))
    onnx.save(small_net(), str(d / "small.onnx"))
    return d


def config(files, *models: dict, dtype: str = "float16") -> PipelineConfig:
    known = {
        "over": {"engine": "onnx", "source": str(files / "over.onnx"),
                 "input": {"height": 8, "width": 8, "resize": "stretch"}},
        "small": {"engine": "onnx", "source": str(files / "small.onnx")},
        "digits": {"arch": "digits"},
    }  # fmt: skip
    entries = [{"name": m["name"], **known[m.get("as", m["name"])], **m} for m in models]
    for e in entries:
        e.pop("as", None)
    return PipelineConfig.model_validate(
        {
            "placement": "split",
            "models": entries,
            "executor": {"backend": "numpy", "dtype": dtype, "buckets": [1, 2]},
        }
    )


def loaded(cfg: PipelineConfig) -> tuple[GpuExecutor, dict]:
    ex = GpuExecutor(cfg.executor)
    report = load_models(ex, cfg)
    assert report.phase == "ready", report.as_dict()
    return ex, report.as_dict()["precision"]


def images(n: int, size: int = 8, channels: int = 3) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, (n, size, size, channels), dtype=np.uint8)


def normalised(img: np.ndarray) -> np.ndarray:
    x = (img / 255.0 - np.array(MEAN)) / np.array(STD)
    return x.transpose(0, 3, 1, 2).astype(np.float32)


# ----------------------------------------------------------------------------- the rule


def test_the_measure_is_the_worst_output_relative_to_its_largest_value():
    rng = np.random.default_rng(0)
    a32 = (rng.standard_normal((4, 100)) * 30).astype(np.float32)
    rounded = a32.astype(np.float16)
    assert fp16_error((a32,), (a32,)) == 0.0
    assert 0 < fp16_error((rounded,), (a32,)) < 1e-3  # float16's own rounding
    assert fp16_error((a32 * 1.05,), (a32,)) == pytest.approx(0.05, rel=1e-3)  # far, finite
    for bad in (np.inf, -np.inf, np.nan):
        b = rounded.copy()
        b[2, 7] = bad
        assert fp16_error((rounded, b), (a32, a32)) == math.inf  # any output, any row
    nan32 = a32.copy()
    nan32[0, 0] = np.nan
    assert math.isnan(fp16_error((rounded,), (nan32,)))
    # a value near zero is not judged by its own relative error, but against the largest
    tiny = np.array([[1000.0, 1e-3]], np.float32)
    assert fp16_error((np.array([[1000.0, 1.5e-3]], np.float16),), (tiny,)) < 1e-6
    zeros = np.zeros((2, 3), np.float32)
    assert fp16_error((zeros.astype(np.float16),), (zeros,)) == 0.0
    idx = np.array([[1, 2]]), np.array([[2, 1]])  # indices: nothing to round
    assert fp16_error((rounded, idx[0]), (a32, idx[1])) < 1e-3


def test_a_verdict_names_its_measure_and_threshold():
    far = Precision("float32", "probe", math.inf)
    assert MEASURE in far.reason() and "inf > 0.01" in far.reason()
    assert "not finite" in far.reason() and far.text().startswith("float32 (probe")
    near = Precision("float16", "probe", 4.5e-4)
    assert near.reason() == f"probe: {MEASURE} = 0.00045 <= 0.01"
    assert near.as_dict() == {
        "dtype": "float16",
        "chosen_by": "probe",
        "fp16_error": 4.5e-4,
        "fp16_finite": True,
        "threshold": FP16_TOLERANCE,
        "why": near.text(),
    }
    assert far.as_dict()["fp16_error"] is None and far.as_dict()["fp16_finite"] is False
    json.dumps(far.as_dict(), allow_nan=False)  # JSON without Infinity
    assert "float32 output not finite either" in Precision("float32", "probe", math.nan).text()
    assert "does not run: TypeError" in Precision("float32", "probe", None, "TypeError: x").text()


# ----------------------------------------------------------------------------- on the executor


def test_an_overflowing_model_serves_in_float32_with_one_warning_and_finite_answers(files, caplog):
    with caplog.at_level(logging.INFO, logger="pipeline.executor"):
        ex, precision = loaded(config(files, {"name": "over"}))
    p = precision["over"]
    assert (p["dtype"], p["chosen_by"], p["fp16_finite"]) == ("float32", "probe", False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "model over serves in float32" in warnings[0]
    assert MEASURE in warnings[0] and "> 0.01" in warnings[0]
    assert ex.precision_of("over").dtype == "float32"
    assert ex.engine_of("over").ctx.dtype == "float32"  # its own context, not the executor's
    assert ex.dtype == "float16" and ex.plan("over", 2).output_specs[0].dtype == "float32"
    ref = ReferenceEvaluator(str(files / "over.onnx"))
    img = images(3)
    (want,) = ref.run(None, {"x": normalised(img)})
    assert np.abs(want).max() > 1e6  # far past float16's 65504
    for got in (ex.infer("over", img), ex.infer("over", normalised(img), feed="tensors")):
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=np.abs(want).max() * 1e-5)
    ex.close()


def test_normal_models_stay_in_float16(files):
    ex, precision = loaded(config(files, {"name": "digits"}, {"name": "small"}))
    for name in ("digits", "small"):
        p = precision[name]
        assert (p["dtype"], p["chosen_by"], p["fp16_finite"]) == ("float16", "probe", True)
        assert 0 < p["fp16_error"] < 2e-3, p  # float16's rounding, measured
        assert ex.plan(name, 1).output_specs[0].dtype == "float16"
    assert ex.stats()["dtypes"] == {"digits": "float16", "small": "float16"}
    ex.close()


def classify(stage, cfg, model: str, img: np.ndarray) -> list:
    target = model_card(next(m for m in cfg.models if m.name == model)).target()
    item = Encoded.checked(encode_png(img), "image/png", target, 1 << 24, 1 << 28)
    specs = [PostSpec("classify", top_k=3), PostSpec("v2", outputs=("logits",))]
    meta = [RequestMeta("a"), RequestMeta("b")]
    return asyncio.run(stage.encoded(model, [item, item], meta, specs))


@pytest.mark.filterwarnings("ignore:overflow encountered")  # numpy's word on the overflow
def test_precision_float16_forces_float16_and_its_overflow_is_an_error_not_a_nan(files):
    cfg = config(
        files,
        {"name": "over16", "as": "over", "precision": "float16"},
        {"name": "over32", "as": "over", "precision": "float32"},
    )
    stage = build_inference(cfg, decode_here=True, answer_here=True)
    models = stage.status()["models"]
    assert models["over16"]["precision"]["dtype"] == "float16"
    assert models["over16"]["precision"]["chosen_by"] == "entry"
    assert models["over32"]["precision"]["dtype"] == "float32"
    img = images(1)[0]
    out = classify(stage, cfg, "over16", img)
    for err in out:  # classify and v2 alike: no NaN score, no infinite tensor
        assert isinstance(err, NonFiniteOutput), err
        assert err.fields["model"] == "over16" and err.fields["dtype"] == "float16"
        assert "precision: float32" in err.fields["fix"]
    ok = classify(stage, cfg, "over32", img)
    assert all(isinstance(a, Answer) for a in ok)
    assert len(ok[0].top_k) == 3 and np.isfinite(ok[1].outputs["logits"]).all()


def test_precision_float32_forces_float32_without_a_probe(files, monkeypatch):
    def no_trial(*args, **kwargs):
        raise AssertionError("the probe ran")

    monkeypatch.setattr(Engine, "trial", no_trial)
    ex, precision = loaded(
        config(
            files, {"name": "digits", "precision": "float32"}, {"name": "small"}, dtype="float32"
        )
    )
    assert precision["digits"]["dtype"] == "float32"
    assert precision["digits"]["chosen_by"] == "entry"
    assert precision["small"]["chosen_by"] == "executor"  # numpy's float32: nothing to probe
    assert ex.plan("digits", 1).output_specs[0].dtype == "float32"
    ex.close()


# ----------------------------------------------------------------------------- the probe's loads


class Scripted(Engine):
    """An engine whose trials answer what the test says, recording every load."""

    name = "scripted"

    def __init__(self, out16: object) -> None:
        super().__init__("scripted")
        self.out16, self.loads, self.trials = out16, [], []

    inputs = (TensorInfo("x", "float32", (-1, 4)),)
    outputs = (TensorInfo("y", "float32", (-1, 4)),)
    feeds = ("tensors",)

    def load(self, ctx: EngineContext) -> None:
        self.ctx = ctx
        self.loads.append(ctx.dtype)

    def plan(self, bucket, feed="image"):
        raise NotImplementedError

    def bind(self, plan, arena):
        raise NotImplementedError

    def trial(self, ctx, feed, stream):
        if self.trial_loads:
            self.load(ctx)
        else:  # as torch's: an eager run of the weights in ctx's dtype, not the served form
            self.ctx = ctx
        self.trials.append((ctx.dtype, feed))
        x = probe_input(TensorSpec((1, 4), "float32"))
        if ctx.dtype == "float32":
            return (x,)
        if isinstance(self.out16, Exception):
            raise self.out16
        return (x.astype(np.float16) * self.out16,)


@pytest.mark.parametrize(
    ("out16", "served", "loads"),
    [
        (1.0, "float16", ["float32", "float16"]),  # kept as the last trial left it
        (1.5, "float32", ["float32", "float16", "float32"]),  # far: loaded once more
        (RuntimeError("no half kernel"), "float32", ["float32", "float16", "float32"]),
    ],
)
def test_the_probe_runs_float32_then_float16_and_reloads_only_to_change(out16, served, loads):
    ex = GpuExecutor(PipelineConfig().executor.model_copy(update={"backend": "numpy"}))
    ctx = EngineContext(ex.backend, "float16", "host", 1 << 20, ex.pool)
    eng = Scripted(out16)
    p = choose(eng, ctx, "auto")
    assert (p.dtype, eng.loads, eng.ctx.dtype) == (served, loads, served)
    assert [d for d, _ in eng.trials] == ["float32", "float16"]
    assert eng.trials[0][1] == "tensors"  # no image feed: its own tensors
    if isinstance(out16, Exception):
        assert p.failed == "RuntimeError: no half kernel"
    ex.close()


@pytest.mark.parametrize(
    ("out16", "served", "loads"),
    [
        (1.0, "float16", ["float16"]),  # kept: loaded once, in float16 (the trials load nothing)
        (1.5, "float32", ["float32"]),
        (RuntimeError("no half kernel"), "float32", ["float32"]),
    ],
)
def test_an_engine_whose_trial_is_not_its_load_is_loaded_in_the_kept_dtype(out16, served, loads):
    """The torch engine's trials run eagerly; only ``load`` compiles (without it a model the
    probe kept in float16 was served unloaded: on the H200, 'no attribute fn' at warm-up)."""
    ex = GpuExecutor(PipelineConfig().executor.model_copy(update={"backend": "numpy"}))
    ctx = EngineContext(ex.backend, "float16", "host", 1 << 20, ex.pool)
    eng = Scripted(out16)
    eng.trial_loads = False
    p = choose(eng, ctx, "auto")
    assert (p.dtype, eng.loads, eng.ctx.dtype) == (served, loads, served)
    ex.close()


def test_probe_input_is_the_same_seeded_batch_every_time():
    img = TensorSpec((1, 8, 8, 3), "uint8")
    a, b = probe_input(img), probe_input(img)
    assert a.dtype == np.uint8 and (a == b).all() and a.std() > 50
    f = probe_input(TensorSpec((1, 16), "float16"))
    assert f.dtype == np.float16 and np.isfinite(f).all()
    assert probe_input(TensorSpec((2, 3), "int64")).dtype == np.int64


# ----------------------------------------------------------------------------- torch, where seen


def test_the_torch_engine_trials_in_each_dtype_and_keeps_its_float32_weights_exact():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
    with torch.no_grad():
        for p in net.parameters():
            p.mul_(3e3)  # past float16's range after two layers
    before = {k: v.clone() for k, v in net.state_dict().items()}
    eng = TorchEngine("t", net, ImageInput(8, 8, 3, MEAN, STD), "float32", scripted=False)
    ex = GpuExecutor(PipelineConfig().executor.model_copy(update={"backend": "numpy"}))
    ctx = EngineContext(ex.backend, "float16", "host", 1 << 20, ex.pool)
    assert eng.dtype_in(ctx) == "float32"  # the CPU path: eager fp32, never probed
    stream = Stream("t", ex.backend)
    out32 = eng.trial(
        EngineContext(ex.backend, "float32", "host", 1 << 20, ex.pool), "image", stream
    )
    out16 = eng.trial(ctx, "image", stream)  # float16 on torch's CPU kernels
    assert np.isfinite(out32[0]).all() and fp16_error(out16, out32) == math.inf
    eng.load(ctx)  # the CPU path: float32, the weights as they were
    after = eng.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    y = eng.fn["image"](torch.from_numpy(images(2)))
    assert y.dtype == torch.float32 and torch.isfinite(y).all()
    ex.close()


def test_ferry_models_says_each_models_precision(files, tmp_path, capsys):
    cfg = config(
        files,
        {"name": "over"},
        {"name": "digits"},
        {"name": "s", "as": "small", "precision": "float32"},
    )
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    assert main(["models", str(path), "--json"]) == 0
    (rows,) = json.loads(capsys.readouterr().out).values()
    got = {r["name"]: r["precision"] for r in rows}
    assert got["over"]["dtype"] == "float32" and got["over"]["fp16_finite"] is False
    assert got["digits"]["dtype"] == "float16" and got["s"]["chosen_by"] == "entry"
    assert main(["models", str(path)]) == 0
    out = capsys.readouterr().out
    assert "  precision: float32 (probe: float16 output not finite, max|fp16 - fp32|" in out
    assert main(["models", str(path), "--no-load"]) == 0
    assert "  precision: auto (the executor's dtype" in capsys.readouterr().out


def test_v1_models_says_each_models_precision_once_the_replica_answers(files):
    stage = build_inference(config(files, {"name": "over"}, {"name": "digits"}))

    async def status() -> dict:
        return stage.status()

    r = rd.Readiness(status, None, lambda: False)
    assert r.state_of("over") == {"state": "starting"}
    virtual_time.run(r.refresh())  # (never raced against a real ANSWER_S)
    over, digits = r.state_of("over"), r.state_of("digits")
    assert over["state"] == "ready" and over["precision"]["dtype"] == "float32"
    assert "inf > 0.01" in over["precision"]["why"]
    assert digits["precision"]["dtype"] == "float16"
