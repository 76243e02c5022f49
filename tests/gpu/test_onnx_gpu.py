"""The ``onnx`` engine on the GPU: 13 torchvision classifiers exported with torch.onnx.export.

Each model gets torchvision's random init with randomised batch-norm statistics, is exported
to ONNX (dynamic batch), imported by Ferry and

- served by the executor on cupy in fp16 through the ``image`` feed (uint8 photos,
  normalised on the device, CUDA graphs per bucket): top-1 equal to torch fp32 on >= 0.95
  of >= 16 real photos (scikit-image's, through Ferry's JPEG decode and centre crop);
- run on numpy in fp32 through the ``tensors`` feed: logits within 1e-3 of torch fp32,
  relative to the largest logit.

The torch reference runs in fp32 on the GPU with TF32 off. Which exporter was used
(TorchScript first: it is fast; the dynamo exporter where it fails; FERRY_ONNX_EXPORTER=
dynamo|torchscript forces one) and every number are printed (run with -s) and named in the
assertion messages.

    python -m pytest -q -s tests/gpu/test_onnx_gpu.py
"""

from __future__ import annotations

import copy
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.model_zoo import MEAN, MODELS, STD
from tests.onnx_models import run_host

pytestmark = pytest.mark.gpu

PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "rocket",
    "hubble_deep_field",
    "immunohistochemistry",
    "camera",
    "coins",
    "moon",
    "page",
    "text",
    "brick",
    "grass",
    "gravel",
    "colorwheel",
    "clock",
    "logo",
    "retina",
    "skin",
    "motorcycle",
)
CPU_ROWS = 4  # photos checked on numpy in fp32 (the CPU is slow for 13 networks)


def photos() -> np.ndarray:
    """>= 16 real photos: scikit-image's that load here, grey ones as RGB, each whole image
    and its left half (two different crops), JPEG-encoded and decoded by Ferry at 224."""
    import skimage.data as d

    from pipeline.imaging import Target, decode, encode_jpeg

    target = Target(224, 224, 3, "center_crop")
    out = []
    for name in PHOTOS:
        try:
            img = getattr(d, name)()
        except (Exception, pytest.skip.Exception):  # not bundled and no network: skip it
            # (under pytest, scikit-image answers a failed download with pytest.skip, which
            # is no Exception: it skipped the whole test on the GPU machine)
            continue
        if isinstance(img, tuple):
            img = img[0]
        img = np.asarray(img)
        if img.dtype != np.uint8:
            img = (
                (np.clip(img, 0, 1) * 255).astype(np.uint8)
                if img.max() <= 1
                else img.astype(np.uint8)
            )
        if img.ndim == 2:
            img = np.stack([img] * 3, axis=-1)
        img = np.ascontiguousarray(img[..., :3])
        for view in (img, img[:, : max(img.shape[1] // 2, 32)]):
            out.append(
                decode(
                    encode_jpeg(np.ascontiguousarray(view), 95), "image/jpeg", target, 40_000_000
                )
            )
    assert len(out) >= 16, f"only {len(out)} photos could be made from scikit-image's data"
    return np.stack(out)


def torchvision_model(arch: str, seed: int = 0):
    """torchvision's random init, batch norms' statistics and affines randomised, eval."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    m = getattr(torchvision.models, arch)(weights=None).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                mod.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                mod.bias.copy_(torch.randn(c, generator=g) * 0.1)
                mod.weight.copy_(torch.rand(c, generator=g) * 0.5 + 0.75)
    return m


def export(model, path: str) -> str:
    """torch.onnx.export with a dynamic batch; returns which exporter wrote the file."""
    import torch

    x = torch.randn(2, 3, 224, 224)
    forced = os.environ.get("FERRY_ONNX_EXPORTER")
    order = [forced] if forced else ["torchscript", "dynamo"]
    errors = []
    for how in order:
        try:
            if how == "torchscript":
                torch.onnx.export(
                    model,
                    (x,),
                    path,
                    input_names=["x"],
                    output_names=["logits"],
                    dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                    opset_version=17,
                    dynamo=False,
                )
            else:
                batch = torch.export.Dim("batch", min=1, max=1024)
                torch.onnx.export(
                    model,
                    (x,),
                    path,
                    input_names=["x"],
                    output_names=["logits"],
                    dynamic_shapes={"x": {0: batch}},
                    dynamo=True,
                )
            return how
        except Exception as exc:  # try the other exporter, say why if both fail
            errors.append(f"{how}: {type(exc).__name__}: {exc}"[:2000])
    raise AssertionError("torch.onnx.export failed:\n" + "\n".join(errors))


@pytest.fixture(scope="module")
def images():
    return photos()


@pytest.fixture(scope="module")
def executor():
    from pipeline.config import ExecutorConfig
    from pipeline.executor import GpuExecutor

    ex = GpuExecutor(
        ExecutorConfig(backend="cupy", dtype="float16", buckets=(8, 32), max_in_flight=2)
    )
    yield ex
    ex.close()


@pytest.mark.parametrize("arch", MODELS)
def test_torchvision_model_through_the_onnx_engine(arch, tmp_path, images, executor):
    import torch

    from pipeline.engines import builder
    from pipeline.engines.base import ImageInput

    t0 = time.perf_counter()
    model = torchvision_model(arch)
    x = ((images / 255.0 - np.array(MEAN)) / np.array(STD)).transpose(0, 3, 1, 2).astype(np.float32)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        ref = model.cuda().float()(torch.from_numpy(x).cuda()).cpu().numpy()
        # the control: torch's own fp16 against torch fp32 on the same photos
        half = copy.deepcopy(model).half()  # a copy: .half() in place would round the weights
        ref16 = half(torch.from_numpy(x).cuda().half()).float().cpu().numpy()
        del half
    model.cpu()
    path = str(tmp_path / f"{arch}.onnx")
    how = export(model, path)
    t_export = time.perf_counter() - t0

    loaded = builder("onnx")(
        SimpleNamespace(name=arch, source=path, backend="native"), ImageInput(224, 224, 3, MEAN, STD)
    )
    kinds = [n.op.name for n in loaded.engine.native.graphs["image"].nodes]
    executor.load(loaded)
    executor.warmup([arch])
    n = len(images)
    rows = []
    for i in range(0, n, 32):
        chunk = np.ascontiguousarray(images[i : i + 32])
        rows.append(
            executor.commit(executor.prepare(arch, len(chunk), feed="image"), chunk).wait(120)
        )
    got16 = np.concatenate(rows).astype(np.float32)
    top_ref, top_got = ref.argmax(1), got16.argmax(1)
    agree = float(np.mean(top_ref == top_got))
    agree_torch16 = float(np.mean(top_ref == ref16.argmax(1)))
    srt = np.sort(ref, axis=1)
    margins = (srt[:, -1] - srt[:, -2]) / np.abs(ref).max()  # relative to the largest logit
    err16 = float(np.abs(got16 - ref).max() / np.abs(ref).max())
    wrong = np.nonzero(top_ref != top_got)[0]

    cpu = run_host(loaded.engine.native.graphs["tensors"], x[:CPU_ROWS])[0]
    err32 = float(np.abs(cpu - ref[:CPU_ROWS]).max() / np.abs(ref[:CPU_ROWS]).max())
    report = (
        f"{arch}: exporter {how}, {len(kinds)} ops ({', '.join(sorted(set(kinds)))}); "
        f"fp16 on the GPU: top-1 agreement with torch fp32 {agree:.3f} on {n} photos "
        f"({len(set(top_ref.tolist()))} distinct torch top-1 classes; torch's own fp16 agrees "
        f"{agree_torch16:.3f}), max logit error {err16:.2e} of the largest logit, disagreeing "
        f"photos {wrong.tolist()} whose torch fp32 top-1/top-2 margins are "
        f"{margins[wrong].round(5).tolist()} of the largest logit; fp32 on numpy: max logit "
        f"error {err32:.2e} on {CPU_ROWS} photos; {time.perf_counter() - t0:.1f} s "
        f"(export {t_export:.1f} s)"
    )
    print(report)
    # random weights leave some photos with top-1 and top-2 closer than fp16 can tell apart;
    # a flip there is fp16's, not the engine's: it is allowed where the margin is below twice
    # the measured fp16 logit error (the report lists them)
    explained = bool(np.all(margins[wrong] <= 2 * err16))
    assert agree >= 0.95 or explained, report
    assert err16 <= 3e-2, report
    assert err32 <= 1e-3, report
