"""The precision probe on cupy (``pipeline/executor_precision.py``), ``executor.dtype: auto``
(float16 on the GPU): torchvision resnet152 with its own random init -- logits of 1e11 and
more, past float16's 65504 (issue 29) -- is served in float32 through the torch engine and
through the onnx engine (on both of its backends), with one WARNING, finite answers near torch fp32 and no second copy
of its weights left on the device; a normal model (resnet18 with calibrated statistics, the
ONNX ``small_net``) stays in float16; the entry's ``precision`` forces either dtype, and a
forced float16 overflow is answered NonFiniteOutput, never a NaN score.

Written without a GPU (none was lent that session): not yet run. Every measure is printed
(run with -s) and named in the assertion messages.

    python -m pytest -q -s tests/gpu/test_precision_gpu.py
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.engines.base import probe_input
from pipeline.errors import NonFiniteOutput
from pipeline.executor import GpuExecutor
from pipeline.executor_precision import FP16_TOLERANCE, MEASURE, fp16_error
from pipeline.models.loading import load_models
from pipeline.ops.base import TensorSpec
from pipeline.stages.messages import Logits, PostSpec, RowTimes
from pipeline.stages.postprocess import PostprocessStage
from tests.onnx_models import overflow_net, small_net

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")
onnx = pytest.importorskip("onnx")
cupy = pytest.importorskip("cupy")

from onnx.reference import ReferenceEvaluator  # noqa: E402

from benchmarks.model_zoo import make, normalised  # noqa: E402

BUCKET = 4


def config(models: list[dict]) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "placement": "one_process",
            "models": models,
            "executor": {
                "backend": "cupy",
                "dtype": "auto",
                "buckets": [BUCKET],
                "max_in_flight": 2,
                "pool_limit_fraction": 0.3,
            },
        }
    )


def pixels(n: int, size: int = 224) -> np.ndarray:
    return np.random.default_rng(11).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def torch_outputs(m, u8: np.ndarray, half: bool) -> np.ndarray:
    """torch's own eager answer on the GPU, fp32 (TF32 off) or fp16 (a copy of the module)."""
    net = copy.deepcopy(m).cuda()
    net = net.half() if half else net.float()
    x = torch.from_numpy(normalised(u8)).cuda()
    with torch.inference_mode(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y = net(x.half() if half else x).float().cpu().numpy()
    del net
    torch.cuda.empty_cache()
    return y


def random_resnet152():
    """torchvision's resnet152 as the torch engine builds ``source: resnet152`` with no
    weights (seed 0): its own init, batch norm at its initial statistics."""
    torch.manual_seed(0)
    return torchvision.models.get_model("resnet152", weights=None).eval()


def export(m, path: str) -> None:
    torch.onnx.export(
        m,
        (torch.randn(2, 3, 224, 224),),
        path,
        input_names=["x"],
        output_names=["logits"],
        dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        dynamo=False,
    )


def warnings_of(caplog, model: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and f"model {model} serves in float32" in r.getMessage()
    ]


@pytest.mark.parametrize("engine", ["torch", "onnx", "onnx_torch"])
def test_random_resnet152_overflows_float16_and_is_served_in_float32(engine, tmp_path, caplog):
    ref = random_resnet152()
    probe = probe_input(TensorSpec((1, 224, 224, 3), "uint8"))  # the probe's own batch
    own = fp16_error((torch_outputs(ref, probe, True),), (torch_outputs(ref, probe, False),))
    print(f"resnet152, random init: torch's own fp16 on the probe: {MEASURE} = {own:.3g}")
    assert not own <= FP16_TOLERANCE, f"the premise: torch's fp16 is fine here ({own:.3g})"
    if engine == "torch":
        entry = {"name": "r152", "engine": "torch", "source": "resnet152"}
    else:
        path = str(tmp_path / "r152.onnx")
        export(ref, path)
        backend = "torch" if engine == "onnx_torch" else "native"
        entry = {"name": "r152", "engine": "onnx", "source": path, "backend": backend}
    cfg = config([entry])
    ex = GpuExecutor(cfg.executor)
    before = torch.cuda.memory_allocated()
    pool = cupy.get_default_memory_pool()  # where the onnx engine's weights live
    pool.free_all_blocks()
    held_before = pool.total_bytes()
    with caplog.at_level(logging.INFO, logger="pipeline.executor"):
        report = load_models(ex, cfg, warm=False)
    assert report.loaded == ["r152"], report.as_dict()
    p = ex.precision_of("r152")
    print(f"resnet152 via {engine}: {p.text()}")
    assert (p.dtype, p.chosen_by) == ("float32", "probe"), p.text()
    assert len(warnings_of(caplog, "r152")) == 1, caplog.text
    # the fp16 trial's weights are not left beside the fp32 ones (torch's, or cupy's pool)
    weights = ex.engine_of("r152").weights_bytes
    if engine in ("torch", "onnx_torch"):
        held = torch.cuda.memory_allocated() - before
    else:
        held = pool.total_bytes() - held_before
    print(f"{engine} holds {held / 1e6:.0f} MB after the probe; fp32 weights {weights / 1e6:.0f}")
    assert held <= 1.25 * weights + (32 << 20), (held, weights)
    ex.warmup()
    u8 = pixels(BUCKET)
    got = np.asarray(ex.infer("r152", u8), np.float32)
    want = torch_outputs(ref, u8, False)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"resnet152 via {engine} in fp32: max|logit| {np.abs(want).max():.3g}, rel {rel:.2e}")
    assert np.isfinite(got).all() and rel < 5e-2, rel  # (the engine's convs may use TF32)
    ex.close()


def test_onnx_models_on_cupy_probed_and_forced(tmp_path, caplog):
    over, small = str(tmp_path / "over.onnx"), str(tmp_path / "small.onnx")
    onnx.save(overflow_net(), over)
    onnx.save(small_net(), small)
    img8 = {"height": 8, "width": 8, "resize": "stretch"}
    cfg = config(
        [
            {"name": "over", "engine": "onnx", "backend": "native", "source": over, "input": img8},
            {"name": "over16", "engine": "onnx", "backend": "native", "source": over, "input": img8,
             "precision": "float16"},
            {"name": "over32", "engine": "onnx", "backend": "native", "source": over, "input": img8,
             "precision": "float32"},
            {"name": "small", "engine": "onnx", "backend": "native", "source": small},
            {"name": "digits", "arch": "digits"},
        ]
    )  # fmt: skip
    ex = GpuExecutor(cfg.executor)
    with caplog.at_level(logging.INFO, logger="pipeline.executor"):
        report = load_models(ex, cfg)
    assert report.phase == "ready", report.as_dict()
    got = {name: ex.precision_of(name) for name in report.loaded}
    for name, p in got.items():
        print(f"{name}: {p.text()}")
    assert (got["over"].dtype, got["over"].chosen_by) == ("float32", "probe")
    assert len(warnings_of(caplog, "over")) == 1, caplog.text
    assert (got["over16"].dtype, got["over16"].chosen_by) == ("float16", "entry")
    assert (got["over32"].dtype, got["over32"].chosen_by) == ("float32", "entry")
    for name in ("small", "digits"):
        p = got[name]
        assert p.dtype == "float16" and p.error is not None and p.error < 5e-3, p.text()
    u8 = pixels(BUCKET, 8)
    (want,) = ReferenceEvaluator(over).run(None, {"x": normalised(u8)})
    for name in ("over", "over32"):
        y = np.asarray(ex.infer(name, u8), np.float32)
        assert np.isfinite(y).all()
        np.testing.assert_allclose(y, want, rtol=1e-2, atol=np.abs(want).max() * 1e-3)
    y16 = ex.infer("over16", u8)
    assert not np.isfinite(y16).all()  # what the probe would have caught
    logits = Logits(
        BUCKET,
        list(range(BUCKET)),
        {},
        1.0,
        data=y16,
        row_times=RowTimes([1.0] * BUCKET, [1.0] * BUCKET, [BUCKET] * BUCKET),
    )
    specs = [PostSpec("classify", top_k=3)] * BUCKET
    for answer in PostprocessStage(cfg).run("over16", logits, specs):
        assert isinstance(answer, NonFiniteOutput), answer
        assert answer.fields["dtype"] == "float16" and "precision" in answer.fields["fix"]
    ex.close()


def test_a_calibrated_torch_model_stays_in_float16_and_is_compiled_so(tmp_path):
    m = make("resnet18")
    path = str(tmp_path / "r18.pt")
    torch.save({k: v.cpu() for k, v in m.state_dict().items()}, path)
    cfg = config([{"name": "r18", "engine": "torch", "source": "resnet18", "weights": path}])
    ex = GpuExecutor(cfg.executor)
    report = load_models(ex, cfg)
    assert report.phase == "ready", report.as_dict()
    p = ex.precision_of("r18")
    print(f"resnet18 (calibrated): {p.text()}")
    assert p.dtype == "float16" and p.chosen_by == "probe" and p.error < FP16_TOLERANCE
    eng = ex.engine_of("r18")
    assert eng.compute == torch.float16
    assert all(t.dtype == torch.float16 for t in eng.module.parameters())
    u8 = pixels(BUCKET)
    got = np.asarray(ex.infer("r18", u8), np.float32)
    want = torch_outputs(m, u8, False)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    print(f"resnet18 in fp16 against torch fp32: rel {rel:.2e}")
    assert rel < 3e-2
    ex.close()
