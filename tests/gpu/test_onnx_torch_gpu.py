"""The onnx engine's torch backend on the GPU (``pipeline/engines/onnx.py``): with ``backend:
auto`` on cupy an ONNX file is lowered to torch and served by the torch engine -- compiled,
fp16 channels-last, in Ferry's CUDA graphs -- and its answers agree with the reference:

- ``small_net`` (conv, batch norm, pools, Gemm; two outputs) against onnx's ReferenceEvaluator;
- torchvision resnet18 and mobilenet_v2 (depthwise) and the tiny ViT and Swin of
  ``tests/models/transformers_torch.py`` against torch fp32 (4 rows: bucket 4's graph).

What ``auto`` does with a node the lowering cannot take is tested on the CPU
(``tests/unit/test_onnx_engine.py``).

The 13-model speed figures are ``benchmarks/bench_models.py`` (``ferry_onnx`` against
``ferry_onnx_native`` and ``torch_compile``). Every measure is printed (run with -s).

    python -m pytest -q -s tests/gpu/test_onnx_torch_gpu.py
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.executor import GpuExecutor
from pipeline.models.loading import load_models
from tests.onnx_models import small_net

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
cupy = pytest.importorskip("cupy")

from onnx.reference import ReferenceEvaluator  # noqa: E402

from benchmarks.model_zoo import make, normalised  # noqa: E402
from tests.models.transformers_torch import MODELS as TINY  # noqa: E402

BUCKETS = (1, 4)


def config(models: list[dict]) -> PipelineConfig:
    return PipelineConfig.model_validate(
        {
            "placement": "one_process",
            "models": models,
            "executor": {"backend": "cupy", "dtype": "auto", "buckets": list(BUCKETS),
                         "max_in_flight": 2, "pool_limit_fraction": 0.3},
        }
    )  # fmt: skip


def pixels(n: int, size: int) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 256, (n, size, size, 3), dtype=np.uint8)


def export(m, item: tuple[int, ...], path: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            m, (torch.randn(2, *item),), path, input_names=["x"], output_names=["logits"],
            dynamic_axes={"x": {0: "b"}, "logits": {0: "b"}}, opset_version=17, dynamo=False,
        )  # fmt: skip


def serve(models: list[dict]):
    cfg = config(models)
    ex = GpuExecutor(cfg.executor)
    report = load_models(ex, cfg)
    assert report.phase == "ready", report.as_dict()
    return ex


def on_torch(ex, name: str) -> None:
    eng = ex.engine_of(name)
    eng = getattr(eng, "inner", eng)  # an epilogue's wrapper
    assert eng.why.startswith("torch"), eng.why
    assert type(eng.impl).__name__ == "TorchEngine"


def test_small_net_on_the_torch_backend_matches_the_reference(tmp_path):
    path = str(tmp_path / "small.onnx")
    onnx.save(small_net(), path)
    ex = serve([{"name": "small", "engine": "onnx", "source": path}])
    try:
        on_torch(ex, "small")
        assert ex.precision_of("small").dtype == "float16"
        ref = ReferenceEvaluator(small_net())
        for n in (1, 3):  # bucket 1, and 3 rows padded to bucket 4
            u8 = pixels(n, 16)
            got = ex.infer("small", u8)
            want = ref.run(None, {"x": normalised(u8)})
            for a, b in zip(got, want, strict=True):
                err = float(np.abs(np.asarray(a, np.float32) - b).max() / np.abs(b).max())
                print(f"small_net, {n} rows, fp16 torch backend: rel err {err:.2e}")
                assert err < 1e-2, err
        assert len(ex.bound_graphs) >= len(BUCKETS)  # a CUDA graph per bucket
    finally:
        ex.close()


def _torchvision(arch: str):
    pytest.importorskip("torchvision")
    return make(arch), (3, 224, 224)  # random weights, batch norms with statistics


CASES = {
    "resnet18": lambda: _torchvision("resnet18"),
    "mobilenet_v2": lambda: _torchvision("mobilenet_v2"),
    "tiny_vit": lambda: (TINY["vit"][0](), TINY["vit"][1]),
    "tiny_swin": lambda: (TINY["swin"][0](), TINY["swin"][1]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_models_on_the_torch_backend_agree_with_torch_fp32(tmp_path, name):
    model, item = CASES[name]()
    path = str(tmp_path / f"{name}.onnx")
    export(model, item, path)
    c, h, w = item
    entry = {"name": name, "engine": "onnx", "source": path,
             "input": {"height": h, "width": w, "resize": "stretch"}}  # fmt: skip
    ex = serve([entry])
    try:
        on_torch(ex, name)
        u8 = pixels(4, h)
        got = np.asarray(ex.infer(name, u8), np.float32)
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            want = model.cuda().float()(torch.from_numpy(normalised(u8)).cuda()).cpu().numpy()
        err = float(np.abs(got - want).max() / np.abs(want).max())
        agree = float(np.mean(got.argmax(1) == want.argmax(1)))
        print(f"{name}: torch backend fp16 against torch fp32: rel err {err:.2e}, top-1 {agree}")
        assert err < 2e-2, err
    finally:
        ex.close()
