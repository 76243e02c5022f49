"""The image peer's replica work on the GPU, without Serve (skipped without CUDA, torch and
torchvision): nvJPEG decode, the U-Net compiled or eager, nvJPEG encode -- its answers are
JPEGs of each frame's size that agree with Ferry's CPU path of the same weights."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _cuda() -> bool:
    try:
        import torch
        import torchvision  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


needs_cuda = pytest.mark.skipif(not _cuda(), reason="needs CUDA, torch and torchvision")


def _ferry_reference(path: str, body: bytes) -> np.ndarray:
    """Ferry's CPU path of one frame, fp32: Pillow's stretch to 256, ImageNet normalisation,
    the U-Net, the normalisation undone and rounded, Pillow's resize back."""
    import simplejpeg
    import torch

    from benchmarks.peers.rayserve_image import MEAN, STD, load_unet
    from pipeline.imaging import fit
    from pipeline.resize_plan import Target

    frame = simplejpeg.decode_jpeg(body, colorspace="RGB")
    mean, std = np.array(MEAN)[:, None, None], np.array(STD)[:, None, None]
    small = fit(frame, Target(256, 256, 3)).transpose(2, 0, 1)
    x = torch.from_numpy(((small / 255 - mean) / std)[None].astype(np.float32))
    with torch.no_grad():
        y = load_unet(path)(x)[0].double().numpy()
    px = np.clip(np.rint((y * std + mean) * 255), 0, 255).astype(np.uint8).transpose(1, 2, 0)
    return fit(px, Target(frame.shape[0], frame.shape[1], 3))


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from benchmarks.image_workload import export_unet

    return export_unet(str(tmp_path_factory.mktemp("unet") / "unet256.pt2"))


@needs_cuda
@pytest.mark.parametrize("compiled", [False, True])
def test_image_core_answers_jpegs_of_each_frames_size_like_ferrys_path(
    model, compiled, tmp_path, monkeypatch
):
    from PIL import Image

    from benchmarks.image_workload import frames
    from benchmarks.loadgen import answer_error
    from benchmarks.peers.rayserve_image import ImageCore
    from loadtest.corpus import corpus

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # this test's own warm-up marker
    core = ImageCore(model, buckets=(8, 16), compile=compiled)
    bodies = list(frames().bodies[:9]) + list(corpus("photos").bodies[:3])  # 12: bucket 16
    answers = core.process(bodies)
    assert len(answers) == 12
    for body, got in zip(bodies, answers, strict=True):
        img = Image.open(io.BytesIO(body))
        assert answer_error(200, got, img.size) is None  # a whole JPEG of the input's size
    for i in (0, 4, 10):  # three frames against Ferry's CPU path, fp32
        got = np.asarray(Image.open(io.BytesIO(answers[i])).convert("RGB")).astype(int)
        want = _ferry_reference(model, bodies[i]).astype(int)
        # JPEG at quality 90, nvJPEG's and libjpeg's decoders, fp16: a few grey levels
        assert np.abs(got - want).mean() < 4.0, i
    bad = core.process([b"not a jpeg", bodies[0]])
    assert bad[0] is None and answer_error(200, bad[1], (1280, 720)) is None
