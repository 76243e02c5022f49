"""The tasks' ops on cupy against their numpy results: Denormalize, ArgmaxMask, ResizeNearest
(its index table uploaded into the workspace, as the op asks), BatchedNms, DetectHead and
the ranking of its boxes (``top_rows``).

All of them passed on an H100 at 5ed6c55 (benchmarks/results/gpu_tests.txt)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.device import Backend, Stream
from pipeline.ops.base import TensorSpec, eager
from pipeline.ops.denormalize import DENORMALIZE
from pipeline.ops.mask import ARGMAX_MASK, RESIZE_NEAREST
from pipeline.ops.nms import NMS

pytestmark = pytest.mark.gpu


def cp():
    import cupy

    return cupy


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_denormalize_and_argmax_match_numpy(dtype):
    x = (np.random.default_rng(0).standard_normal((3, 4, 9, 11)) * 2).astype(dtype)
    kw = {"layout": "nchw", "scale": (50.0, 60.0, 70.0, 80.0), "shift": (100.0,) * 4}
    (host,) = eager(DENORMALIZE, x, **kw)
    (dev,) = eager(DENORMALIZE, cp().asarray(x), **kw)
    assert np.abs(cp().asnumpy(dev).astype(int) - host).max() <= 1
    (m_host,) = eager(ARGMAX_MASK, x.astype(np.float32))
    (m_dev,) = eager(ARGMAX_MASK, cp().asarray(x.astype(np.float32)))
    assert (cp().asnumpy(m_dev) == m_host).all()


def test_resize_nearest_reads_its_uploaded_table():
    x = np.random.default_rng(1).integers(0, 5, (40, 60), dtype=np.uint8)
    attrs = {"height": 97, "width": 31, "window": (3, 7, 30, 50)}
    (host,) = eager(RESIZE_NEAREST, x, **attrs)
    plan = RESIZE_NEAREST.prepare(TensorSpec.of(x), **attrs)
    ws = cp().zeros(plan.workspace_bytes, cp().uint8)
    table = RESIZE_NEAREST.table(plan)
    ws[: len(table)] = cp().asarray(table)
    y = cp().empty(plan.outputs[0].shape, cp().uint8)
    stream = Stream("t", Backend("cupy"))
    RESIZE_NEAREST.commit(plan, [cp().asarray(x)], [y], ws, stream)
    stream.synchronize()
    assert (cp().asnumpy(y) == host).all()


def test_batched_nms_matches_numpy():
    rng = np.random.default_rng(2)
    xy = rng.uniform(0, 50, (4, 300, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 30, (4, 300, 2))], -1).astype(np.float32)
    scores = rng.uniform(0, 1, (4, 300)).astype(np.float32)
    classes = rng.integers(0, 5, (4, 300)).astype(np.int32)
    kw = {"iou_threshold": 0.5, "score_threshold": 0.1, "max_candidates": 256, "max_boxes": 50}
    host = eager(NMS, boxes, scores, classes, **kw)
    dev = eager(NMS, *(cp().asarray(a) for a in (boxes, scores, classes)), **kw)
    for h, d in zip(host, dev, strict=True):
        assert (cp().asnumpy(d) == h).all()


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    "attrs",
    [
        {"objectness": True, "activation": "none", "box_format": "cxcywh", "scale": None},
        {"objectness": True, "activation": "sigmoid", "box_format": "xyxy", "scale": (64.0, 48.0)},
        {"objectness": False, "activation": "sigmoid", "box_format": "cxcywh", "scale": None},
    ],
)
def test_detect_head_matches_numpy(dtype, attrs):
    """The detection epilogue (``DetectHead``) on cupy: the same classes as numpy, scores
    and corners to float32's rounding (exp on the device may differ in its last bit)."""
    from pipeline.ops.detect_head import DETECT_HEAD

    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 300, 4 + int(attrs["objectness"]) + 6)).astype(np.float32) * 3
    x[..., :4] = rng.uniform(0, 64, (4, 300, 4))
    x[0, :7, 4] = 0.0
    x = x.astype(dtype)
    (host,) = eager(DETECT_HEAD, x, **attrs)
    (dev,) = eager(DETECT_HEAD, cp().asarray(x), **attrs)
    dev = cp().asnumpy(dev)
    np.testing.assert_array_equal(dev[..., 5], host[..., 5])
    np.testing.assert_allclose(dev[..., :5], host[..., :5], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "n,b,k", [(3, 8400, 512), (2, 25200, 4096), (4, 300, 300), (2, 1500, 1), (1, 40, 7)]
)
def test_top_rows_matches_numpy(n, b, k):
    """``top_rows`` (the detection epilogue's ranking: a radix select and a bitonic sort in
    one block an image) against numpy's stable argsort, to the bit: the same rows in the
    same order, ties (scores of few distinct values, -0.0 with 0.0) in the head's order."""
    from pipeline.ops.top_rows import top_rows

    rng = np.random.default_rng(b + k)
    y = rng.uniform(0, 640, (n, b, 6)).astype(np.float32)
    y[..., 4] = rng.integers(-3, 40, (n, b)) / 8.0  # many ties, some below 0
    y[0, : b // 3, 4] = rng.random(b // 3, dtype=np.float32)  # and distinct values
    y[-1, ::5, 4] = -0.0
    host = np.empty((n, k, 6), np.float32)
    top_rows(np, y, host, 4)
    dev = cp().empty((n, k, 6), cp().float32)
    top_rows(cp(), cp().asarray(y), dev, 4)
    np.testing.assert_array_equal(cp().asnumpy(dev), host)


def test_detect_head_keep_matches_numpy():
    """DetectHead with ``keep`` (as a ``detect`` task's epilogue runs it) on cupy: each
    image's 512 best of 8,400 boxes, best first, as numpy ranks them (raw scores times a
    raw objectness: the same floats on both)."""
    from pipeline.ops.detect_head import DETECT_HEAD

    rng = np.random.default_rng(6)
    x = rng.standard_normal((3, 8400, 4 + 1 + 80)).astype(np.float32)
    x[..., :4] = rng.uniform(0, 640, (3, 8400, 4))
    attrs = {"objectness": True, "activation": "none", "box_format": "cxcywh", "keep": 512}
    (host,) = eager(DETECT_HEAD, x, **attrs)
    (dev,) = eager(DETECT_HEAD, cp().asarray(x), **attrs)
    assert host.shape == (3, 512, 6)
    np.testing.assert_array_equal(cp().asnumpy(dev)[..., 4:], host[..., 4:])
    np.testing.assert_allclose(cp().asnumpy(dev)[..., :4], host[..., :4], rtol=1e-6)
