"""GPU preprocessing on one device: the batch it makes matches the CPU decode path."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.imaging import decode, encode_jpeg, encode_png
from pipeline.models.registry import model_info

pytestmark = pytest.mark.gpu


def _core():
    from deployments.preprocess_gpu import PreprocessGpuCore

    cfg = PipelineConfig.model_validate(
        {
            "models": [
                {"name": "resnet50", "arch": "resnet50"},
                {"name": "digits", "arch": "digits"},
            ],
            "preprocess": {"device": "gpu"},
            "preprocess_deployment": {"num_gpus": 1},
            "transport": {"staging_slots": 2, "staging_slot_bytes": 1 << 20},
        }
    )
    return PreprocessGpuCore(cfg)


def test_gpu_batch_matches_cpu_decode_for_photos_jpeg_and_png():
    import skimage.data as d

    core = _core()
    target = model_info("resnet50").target()
    blobs = []
    for name in ("chelsea", "astronaut", "coffee", "rocket"):
        img = getattr(d, name)()
        blobs += [(encode_jpeg(img), "image/jpeg"), (encode_png(img), "image/png")]
    imgs = [core.cpu.decode_one("resnet50", b, ct) for b, ct in blobs]
    # 1 MB slots: the PNGs (up to 786 KB decoded) force several uploads and one oversize path
    out = core.batch("resnet50", imgs)
    core.stream.synchronize()
    got = out.get()
    assert got.shape == (len(blobs), 224, 224, 3) and got.dtype == np.uint8
    for i, (b, ct) in enumerate(blobs):
        want = decode(b, ct, target, 1 << 30)
        diff = np.abs(got[i].astype(np.int16) - want.astype(np.int16))
        # the same filter as Pillow's; Pillow rounds to uint8 between its two passes
        assert diff.mean() < 0.5 and np.percentile(diff, 99.9) <= 2, (i, diff.mean(), diff.max())
    core.close()


def test_gpu_batch_of_digits_stretch_and_more_images_than_slots():
    from pipeline.models import digits

    core = _core()
    _, _, xte, _ = digits.load_split()
    big = np.repeat(np.repeat(xte[:200], 2, axis=1), 2, axis=2)
    imgs = [core.cpu.decode_one("digits", encode_png(x), "image/png") for x in big]
    out = core.batch("digits", imgs)
    core.stream.synchronize()
    out = out.get()
    target = model_info("digits").target()
    want = np.stack([decode(encode_png(x), "image/png", target, 1 << 20) for x in big])
    assert out.shape == want.shape == (200, target.height, target.width, 1)
    diff = np.abs(out.astype(np.int16) - want)
    assert diff.mean() < 0.5 and diff.max() <= 2, (diff.mean(), diff.max())
    assert core.ring.available() >= 0
    core.close()
