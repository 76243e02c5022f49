"""The tasks' ops on numpy against plain references: Denormalize, ArgmaxMask, ResizeNearest
(and its table) and BatchedNms (against greedy NMS written out, class by class, also where
only a few of many boxes pass the threshold)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import InvalidInput
from pipeline.ops.base import TensorSpec, eager
from pipeline.ops.denormalize import DENORMALIZE
from pipeline.ops.mask import ARGMAX_MASK, RESIZE_NEAREST
from pipeline.ops.nms import NMS


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_denormalize_undoes_a_normalisation_and_clips(layout, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 7)).astype(dtype) * 3
    scale, shift = (58.4, 57.1, 57.4), (123.7, 116.3, 103.5)
    src = x if layout == "nchw" else x.transpose(0, 2, 3, 1).copy()
    (y,) = eager(DENORMALIZE, src, layout=layout, scale=scale, shift=shift)
    want = x.astype(np.float32).transpose(0, 2, 3, 1) * np.float32(scale) + np.float32(shift)
    want = np.clip(np.rint(want), 0, 255)
    assert y.dtype == np.uint8 and y.shape == (2, 5, 7, 3)
    assert np.abs(y.astype(int) - want).max() <= (1 if dtype == "float16" else 0)
    assert y.min() == 0 and y.max() == 255  # clipped both ways


def test_denormalize_refuses_what_it_cannot_do():
    x = TensorSpec((1, 3, 4, 4), "float32")
    with pytest.raises(InvalidInput, match="per channel"):
        DENORMALIZE.prepare(x, scale=(1.0, 2.0), shift=(0.0, 0.0))
    with pytest.raises(InvalidInput, match="dtype"):
        DENORMALIZE.prepare(TensorSpec((1, 3, 4, 4), "uint8"))
    plan = DENORMALIZE.prepare(x)
    assert plan.workspace_bytes == 4 * 4 * 4 * 3 and plan.outputs[0] == TensorSpec(
        (1, 4, 4, 3), "uint8"
    )


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
def test_argmax_mask_is_the_first_best_class_a_pixel(layout):
    x = np.random.default_rng(1).standard_normal((2, 6, 4, 5)).astype(np.float32)
    x[0, :, 0, 0] = 1.0  # a tie: the first class
    src = x if layout == "nchw" else x.transpose(0, 2, 3, 1).copy()
    (m,) = eager(ARGMAX_MASK, src, layout=layout)
    assert m.dtype == np.uint8 and (m == x.argmax(1)).all() and m[0, 0, 0] == 0
    with pytest.raises(InvalidInput, match="256"):
        ARGMAX_MASK.prepare(TensorSpec((1, 300, 2, 2), "float32"))


def test_resize_nearest_reads_its_window_and_its_table_says_the_same():
    x = np.arange(6 * 8, dtype=np.uint8).reshape(6, 8)
    (y,) = eager(RESIZE_NEAREST, x, height=4, width=8, window=(1, 2, 2, 4))
    assert (y == np.repeat(np.repeat(x[1:3, 2:6], 2, 0), 2, 1)).all()
    (same,) = eager(RESIZE_NEAREST, x, height=6, width=8)
    assert (same == x).all()
    plan = RESIZE_NEAREST.prepare(TensorSpec.of(x), height=4, width=8, window=(1, 2, 2, 4))
    table = RESIZE_NEAREST.table(plan)
    rows = table[:32].view(np.int64)
    assert rows.tolist() == [1, 1, 2, 2] and plan.workspace_bytes >= len(table) + 4 * 8
    with pytest.raises(InvalidInput, match="out of range"):
        RESIZE_NEAREST.prepare(TensorSpec.of(x), height=4, width=4, window=(5, 0, 2, 2))


def greedy(boxes, scores, classes, iou_thr, score_thr, k, m):
    """Greedy NMS one image at a time, class by class, in plain Python."""

    def iou(a, b):
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        inter = w * h
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
        return inter / union if union > 0 else 0.0

    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
    kept: list[int] = []
    for i in order:
        if scores[i] < score_thr:
            continue
        if all(classes[j] != classes[i] or iou(boxes[i], boxes[j]) <= iou_thr for j in kept):
            kept.append(i)
    return kept[:m]


@pytest.mark.parametrize("seed", range(4))
def test_batched_nms_is_greedy_nms_per_class(seed):
    rng = np.random.default_rng(seed)
    n, b = 3, 40
    xy = rng.uniform(0, 50, (n, b, 2))
    wh = rng.uniform(5, 30, (n, b, 2))
    boxes = np.concatenate([xy, xy + wh], -1).astype(np.float32)
    scores = rng.uniform(0, 1, (n, b)).astype(np.float32)
    classes = rng.integers(0, 3, (n, b)).astype(np.int32)
    for iou_thr, score_thr, k, m in ((0.5, 0.2, 40, 100), (0.3, 0.0, 16, 5), (1.0, 0.9, 40, 50)):
        keep, count = eager(
            NMS,
            boxes,
            scores,
            classes,
            iou_threshold=iou_thr,
            score_threshold=score_thr,
            max_candidates=k,
            max_boxes=m,
        )
        assert keep.shape == (n, m) and count.dtype == np.int32
        for i in range(n):
            want = greedy(boxes[i], scores[i], classes[i], iou_thr, score_thr, k, m)
            assert keep[i, : count[i]].tolist() == want
            assert (keep[i, count[i] :] == -1).all()


@pytest.mark.parametrize("seed", range(3))
def test_batched_nms_takes_only_the_candidates_past_the_threshold(seed):
    """On numpy the sort and the overlaps take only the boxes at or above the threshold (at
    most ``max_candidates`` an image): the same boxes as greedy NMS over every candidate,
    with tied scores (the earlier box first), NaN scores (never a candidate), an image with
    no box past the threshold, and more past it than ``max_candidates``."""
    rng = np.random.default_rng(10 + seed)
    n, b = 4, 600
    xy = rng.uniform(0, 80, (n, b, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(5, 30, (n, b, 2))], -1).astype(np.float32)
    scores = (np.round(rng.uniform(0, 1, (n, b)) * 20) / 20).astype(np.float32)  # many ties
    scores[1, ::7] = np.nan
    scores[2] = np.minimum(scores[2], 0.3)  # nothing at 0.5 in this image
    classes = rng.integers(0, 4, (n, b)).astype(np.int32)
    for iou_thr, score_thr, k, m in ((0.5, 0.5, 512, 100), (0.3, 0.05, 64, 20), (0.6, 0.99, 8, 3)):
        kw = {"iou_threshold": iou_thr, "score_threshold": score_thr}
        keep, count = eager(NMS, boxes, scores, classes, **kw, max_candidates=k, max_boxes=m)
        for i in range(n):
            s = np.where(np.isnan(scores[i]), -np.inf, scores[i])  # (NaN: last, as numpy sorts)
            want = greedy(boxes[i], s, classes[i], iou_thr, score_thr, k, m)
            assert keep[i, : count[i]].tolist() == want
            assert (keep[i, count[i] :] == -1).all()
        assert count[2] == 0 if score_thr > 0.3 else count[2] > 0
    keep, count = eager(NMS, boxes, scores, classes, score_threshold=1.5, max_boxes=4)
    assert (count == 0).all() and (keep == -1).all()  # no box of the call is a candidate


def test_batched_nms_checks_its_shapes():
    with pytest.raises(InvalidInput, match="boxes"):
        NMS.prepare(
            TensorSpec((1, 4, 4), "float32"),
            TensorSpec((1, 5), "float32"),
            TensorSpec((1, 4), "int32"),
        )
