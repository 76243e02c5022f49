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


def test_gpu_fit_of_extreme_strips_is_bounded_and_matches_cpu():
    """A 60000x1 strip (CPU-decoded, uploaded through the ring or the pageable path) is
    fitted by its plan's output window: the device pool grows by about the output, not by
    the 15,360,000 x 256 resize the old path allocated, and the pixels match the CPU."""
    import cupy

    core = _core()
    target = model_info("resnet50").target()
    rng = np.random.default_rng(0)
    blobs, refused = [], []
    # 3 x 150,000 decodes to 1.35 MB: over a 1 MB slot, so it takes the pageable path
    for shape in ((1, 60000), (60000, 1), (3, 150_000), (1, 200_000)):
        img = rng.integers(0, 255, (*shape, 3), dtype=np.uint8)
        some = [(encode_png(img), "image/png")]
        if max(shape) <= 65500:  # JPEG's own limit on a side
            some.append((encode_jpeg(img), "image/jpeg"))
        (refused if shape == (1, 200_000) else blobs).extend(some)
    imgs = [core.cpu.decode_one("resnet50", b, ct) for b, ct in blobs]
    pool = cupy.get_default_memory_pool()
    cupy.cuda.runtime.deviceSynchronize()
    before = pool.total_bytes()
    out = core.batch("resnet50", imgs)
    core.stream.synchronize()
    grew = pool.total_bytes() - before
    assert grew < 64 << 20, grew
    for i, (b, ct) in enumerate(blobs):
        want = decode(b, ct, target, 1 << 30)
        diff = np.abs(out[i].get().astype(np.int16) - want.astype(np.int16))
        assert diff.mean() < 0.5 and np.percentile(diff, 99.9) <= 2, (i, diff.mean())
    # a 1 x 200,000 strip's centre crop is past the plan's exact geometry: a 400 on both paths
    from pipeline.errors import InvalidInput

    for b, ct in refused:
        with pytest.raises(InvalidInput, match="aspect ratio"):
            core.cpu.decode_one("resnet50", b, ct)
    core.close()
