"""Vision transformers through the ONNX importer on the CPU: tiny ViT, DeiT (a distillation
token), DINOv2 (an interpolated position embedding), Swin and ConvNeXt (tests/models/transformers_torch.py), exported in the test by both
torch exporters (TorchScript, opset 17, dynamic batch; dynamo where onnxscript is
installed), imported and run on numpy -- and lowered back to torch, the onnx engine's torch
backend -- against torch fp32 (relative error <= 1e-5), at
more than one batch size from one import; and the import plans every graph for float16 on
the GPU, so a bucket's CUDA graph has no host step. Skips without torch or onnx."""

from __future__ import annotations

import importlib.util
import os
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from pipeline.importers.onnx_graph import load_onnx  # noqa: E402
from pipeline.importers.onnx_lower import lower  # noqa: E402
from tests.models.transformers_torch import MODELS  # noqa: E402
from tests.onnx_models import run_host  # noqa: E402

RTOL = 1e-5
HAS_ONNXSCRIPT = importlib.util.find_spec("onnxscript") is not None
EXPORTERS = [
    "torchscript",
    pytest.param(
        "dynamo",
        marks=pytest.mark.skipif(not HAS_ONNXSCRIPT, reason="the dynamo exporter needs onnxscript"),
    ),
]
ATTENTION_OPS = {
    "vit": "matmul",
    "deit": "matmul",
    "dinov2": "matmul",
    "swin": "pad",
    "convnext": "layer_norm",
}


def export(model, item: tuple[int, ...], path: str, exporter: str) -> None:
    x = torch.randn(2, *item)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch = torch.export.Dim("batch", min=1, max=1024)
            torch.onnx.export(
                model, (x,), path, dynamo=True, input_names=["input"], output_names=["logits"],
                dynamic_shapes=({0: batch},), external_data=False,
            )  # fmt: skip
        else:
            torch.onnx.export(
                model, (x,), path, dynamo=False, opset_version=17, input_names=["input"],
                output_names=["logits"], dynamic_axes={"input": {0: "b"}, "logits": {0: "b"}},
            )  # fmt: skip


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformer_matches_torch_on_numpy(tmp_path, name, exporter):
    build, item = MODELS[name]
    model = build()
    path = str(tmp_path / f"{name}.onnx")
    export(model, item, path, exporter)
    m = load_onnx(path)  # plans float32 on the host and float16 for the GPU, or refuses
    assert m.outputs[0].shape == (-1, 10)
    g = m.graph()
    assert ATTENTION_OPS[name] in m.op_kinds()
    x = torch.randn(5, *item, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x).numpy()
    lowered = lower(m)  # the onnx engine's torch backend, eager here
    for n in (1, 3, 5):  # one import, every bucket planned from it
        (got,) = run_host(g, x[:n].numpy())
        assert got.shape == (n, 10)
        assert rel_err(got, ref[:n]) <= RTOL, (name, exporter, n, rel_err(got, ref[:n]))
        with torch.no_grad():
            (low,) = lowered(x[:n])
        assert rel_err(low.numpy(), ref[:n]) <= RTOL, ("torch", name, exporter, n)


def test_a_padded_bucket_row_does_not_change_the_others(tmp_path):
    """Attention mixes tokens, never batch items: a row answers the same in a batch of 1 as
    in a batch of 4 whose other rows are zeros (a padded bucket) or other images."""
    build, item = MODELS["vit"]
    path = str(tmp_path / "vit.onnx")
    export(build(), item, path, "torchscript")
    g = load_onnx(path).graph()
    x = np.random.default_rng(0).standard_normal((4, *item)).astype(np.float32)
    (alone,) = run_host(g, x[:1])
    padded = np.zeros_like(x)
    padded[0] = x[0]
    (in_pad,) = run_host(g, padded)
    (in_batch,) = run_host(g, x)
    np.testing.assert_allclose(in_pad[0], alone[0], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(in_batch[0], alone[0], rtol=1e-6, atol=1e-7)


def test_torch_mha_moves_the_batch_and_the_importer_follows(tmp_path):
    """torchvision's ViT attention (nn.MultiheadAttention) runs on [L, N, E] and
    [N * heads, L, d]: the imported graph transposes the batch out of axis 0 and back."""
    build, item = MODELS["vit"]
    path = str(tmp_path / "vit.onnx")
    export(build(), item, path, "torchscript")
    m = load_onnx(path)
    g = m.graph()
    shapes = {s.shape for s in g.prepare(3, "float32", "host").specs.values()}
    assert (17, 3, 32) in shapes  # [L, N, E]: 17 tokens of 32 for a batch of 3
    assert (3 * 4, 17, 8) in shapes  # [N * heads, L, d]
    assert (17, 5, 32) in {s.shape for s in g.prepare(5, "float32", "host").specs.values()}
    kinds = m.op_kinds()
    assert kinds.count("matmul") == 4 and "softmax_axis" in kinds and "expand" in kinds


FULL = os.environ.get("FERRY_FULL_TRANSFORMERS") == "1"


@pytest.mark.skipif(not FULL, reason="full-size models: set FERRY_FULL_TRANSFORMERS=1 (minutes)")
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("arch", ["vit_b_16", "deit_b_16", "swin_t", "convnext_tiny"])
def test_full_size_torchvision_transformer_on_numpy(tmp_path, arch, exporter):
    """torchvision's vit_b_16, swin_t, convnext_tiny and a DeiT-B/16-style ViT at 224, on
    numpy against torch fp32 (<= 1e-5); needs torchvision built for the installed torch."""
    try:
        import torchvision  # noqa: F401  (optional: the full-size models)

        from tests.gpu.test_onnx_transformers_gpu import export as export_full
        from tests.gpu.test_onnx_transformers_gpu import model_of
    except Exception as exc:  # torchvision missing, or built for another torch
        pytest.skip(f"torchvision does not import: {type(exc).__name__}: {exc}")
    model = model_of(arch)
    path = str(tmp_path / f"{arch}.onnx")
    export_full(model, path, exporter)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = model(x).numpy()
    (got,) = run_host(load_onnx(path).graph(), x.numpy())
    assert rel_err(got, ref) <= RTOL, (arch, exporter, rel_err(got, ref))


def test_the_image_feed_serves_a_transformer_as_the_tensor_feed(tmp_path):
    """The image feed (uint8 NHWC, normalised inside) is the graph the engine serves: the
    class token's Expand takes its batch from the image input there."""
    from pipeline.importers.onnx_graph import ImageFeed

    build, item = MODELS["deit"]
    path = str(tmp_path / "deit.onnx")
    export(build(), item, path, "torchscript")
    m = load_onnx(path)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    img = np.random.default_rng(4).integers(0, 256, (3, 16, 16, 3), dtype=np.uint8)
    x = ((img / 255.0 - np.array(mean)) / np.array(std)).transpose(0, 3, 1, 2)
    (want,) = run_host(m.graph(), x.astype(np.float32))
    (got,) = run_host(m.graph(ImageFeed(mean, std)), img)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
