"""BatchedNms: greedy non-maximum suppression for a batch of images at once, class-aware.

    plan = NMS.prepare(boxes, scores, classes, iou_threshold=0.45, score_threshold=0.25,
                       max_candidates=512, max_boxes=100)
    NMS.commit(plan, [boxes, scores, classes], [keep, count], workspace, stream)

``boxes`` [N, B, 4] float32 (x0, y0, x1, y1), ``scores`` [N, B] float32, ``classes``
[N, B] int32. Each image's ``max_candidates`` best boxes at or above ``score_threshold``
are taken in score order (a stable sort: the earlier box first on a tie); a box is kept
unless a kept box of its class before it overlaps it by more than ``iou_threshold``
(torchvision's ``batched_nms``: classes apart by offsetting their boxes). ``keep``
[N, max_boxes] int32 holds the kept boxes' indices in score order, -1 after the last;
``count`` [N] int32 how many.

One code path for both backends (``xp``): the greedy pass is a step a candidate, each
vectorised over the batch. On numpy the candidates are the boxes at or above the threshold
alone (at most ``max_candidates`` an image), sorted on their own, and only the overlaps of
pairs of one class are computed; on cupy the plan's shapes
hold -- every box sorted, ``max_candidates`` squared overlaps an image -- so the work does
not depend on the boxes, and the sort and the overlaps allocate their temporaries from
cupy's pool (not the workspace): the op is not yet fit for a CUDA graph. Both give the same
boxes (``tests/gpu/test_task_ops_gpu.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from .base import OpPlan, TensorSpec, XpOp, check_tensor

MAX_CANDIDATES = 4096


class BatchedNms(XpOp):
    name = "batched_nms"
    n_inputs = (3, 3)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        boxes, scores, classes = specs
        check_tensor(self.name, "boxes", boxes, 3, ("float32",))
        check_tensor(self.name, "scores", scores, 2, ("float32",))
        check_tensor(self.name, "classes", classes, 2, ("int32",))
        n, b, four = boxes.shape
        if four != 4 or scores.shape != (n, b) or classes.shape != (n, b):
            raise InvalidInput(
                "batched_nms: boxes [N, B, 4], scores and classes [N, B]",
                boxes=boxes.shape,
                scores=scores.shape,
                classes=classes.shape,
            )
        iou = float(attrs.get("iou_threshold", 0.45))
        thr = float(attrs.get("score_threshold", 0.0))
        k = min(int(attrs.get("max_candidates", 512)), b)
        m = int(attrs.get("max_boxes", 100))
        if not (0.0 <= iou <= 1.0 and 1 <= k <= MAX_CANDIDATES and m >= 1):
            raise InvalidInput(
                "batched_nms: iou_threshold in [0, 1], max_candidates in [1, 4096], max_boxes >= 1",
                iou_threshold=iou,
                max_candidates=k,
                max_boxes=m,
            )
        outs = (TensorSpec((n, m), "int32"), TensorSpec((n,), "int32"))
        return OpPlan(
            self.name,
            specs,
            outs,
            0,
            flops=n * k * k * 12,
            bytes_moved=boxes.nbytes + scores.nbytes + n * k * k * 4,
            attrs=(
                ("iou_threshold", iou),
                ("max_boxes", m),
                ("max_candidates", k),
                ("score_threshold", thr),
            ),
            detail=(iou, thr, k, m),
        )

    def run_xp(
        self, xp: Any, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        batched_nms(xp, plan.detail, *inputs, *outputs)


def _iou(xp: Any, a: Any, c: Any) -> Any:
    """IoU of boxes ``a`` and ``c`` [..., 4] (x0, y0, x1, y1), broadcast against each other."""
    area_a = xp.maximum(a[..., 2] - a[..., 0], 0) * xp.maximum(a[..., 3] - a[..., 1], 0)
    area_c = xp.maximum(c[..., 2] - c[..., 0], 0) * xp.maximum(c[..., 3] - c[..., 1], 0)
    w = xp.minimum(a[..., 2], c[..., 2]) - xp.maximum(a[..., 0], c[..., 0])
    h = xp.minimum(a[..., 3], c[..., 3]) - xp.maximum(a[..., 1], c[..., 1])
    inter = xp.maximum(w, 0) * xp.maximum(h, 0)
    union = area_a + area_c - inter
    return xp.where(union > 0, inter / xp.where(union > 0, union, 1), 0)


def _overlaps(xp: Any, b: Any) -> Any:
    """IoU of every pair of boxes of each image: [N, K, 4] -> [N, K, K]."""
    return _iou(xp, b[:, :, None, :], b[:, None, :, :])


def _over_same_class(b: np.ndarray, cls: np.ndarray, alive: np.ndarray, thr: float) -> np.ndarray:
    """[N, K, K]: whether candidate j (after i in score order) of the same class overlaps
    candidate i by more than ``thr``, both alive. Only such pairs can suppress one another,
    so only their overlaps are computed (a head of 80 classes has about 1/80 of the pairs):
    the dense overlaps of every pair cost numpy ~16 ms an image at 512 candidates."""
    n, k = alive.shape
    pairs = (cls[:, :, None] == cls[:, None, :]) & alive[:, :, None] & alive[:, None, :]
    pairs &= np.triu(np.ones((k, k), dtype=bool), 1)[None]
    img, i, j = np.nonzero(pairs)
    hit = _iou(np, b[img, i], b[img, j]) > thr
    over = np.zeros((n, k, k), dtype=bool)
    over[img[hit], i[hit], j[hit]] = True
    return over


def _candidates(scores: np.ndarray, score_thr: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each image's boxes at or above the threshold, best first (the earlier box first on a
    tie), at most ``k``: ``order`` [N, K'] and ``alive`` [N, K'], K' the most any image has;
    a row's columns past its own count are padding (box 0, not alive). Only these boxes can
    be kept or suppress one, and they lead the image's score order, so the overlaps and the
    greedy pass need no more columns -- a real head has tens above the threshold of its
    thousands of boxes -- and the sort is of them alone, not of every box."""
    n = scores.shape[0]
    rows, cols = np.nonzero(scores >= score_thr)
    o = np.lexsort((cols, -scores[rows, cols], rows))  # by image, score down, then index
    rows, cols = rows[o], cols[o]
    rank = np.arange(len(rows)) - np.searchsorted(rows, np.arange(n))[rows]
    take = rank < k
    rows, cols, rank = rows[take], cols[take], rank[take]
    width = int(rank.max()) + 1 if len(rank) else 0
    order = np.zeros((n, width), np.int64)
    alive = np.zeros((n, width), bool)
    order[rows, rank] = cols
    alive[rows, rank] = True
    return order, alive


def batched_nms(
    xp: Any, detail: tuple, boxes: Any, scores: Any, classes: Any, keep: Any, count: Any
) -> None:
    """The op on ``xp`` (numpy or cupy)."""
    iou_thr, score_thr, k, m = detail
    if xp is np:  # (a device would wait on the host for the candidates' count)
        order, alive = _candidates(scores, score_thr, k)
        k = order.shape[1]
        if k == 0:  # no box of the call at or above the threshold
            keep[...] = -1
            count[...] = 0
            return
    else:
        order = xp.argsort(-scores, axis=1, kind="stable")[:, :k]
        alive = xp.take_along_axis(scores, order, axis=1) >= score_thr
    b = xp.take_along_axis(boxes, order[..., None], axis=1).astype(xp.float64)
    if xp is np:
        cls = np.take_along_axis(classes, order, axis=1)
        over = _over_same_class(b, cls, alive, iou_thr)
    else:
        cls = xp.take_along_axis(classes, order, axis=1).astype(xp.float64)
        # classes never overlap: each is moved past every candidate box of the image (only
        # they are compared; a wild box below the threshold must not cost the others their
        # precision)
        far = xp.where(alive[..., None], xp.abs(b), 0.0).max(axis=(1, 2), keepdims=True)
        b = b + (cls * (far * 2 + 1)[..., 0])[..., None]
        over = _overlaps(xp, b) > iou_thr  # [N, K, K]
        later = xp.triu(xp.ones((k, k), dtype=bool), 1)
        over &= later[None]
    for i in range(k):  # box i, where it is kept, suppresses the later boxes it overlaps
        alive &= ~(over[:, i, :] & alive[:, i : i + 1])
    first = xp.argsort(~alive, axis=1, kind="stable")[:, :m]  # the kept, in score order
    n_kept = alive.sum(axis=1)
    picked = xp.take_along_axis(order, first, axis=1)
    j = xp.arange(first.shape[1])[None, :]
    keep[...] = -1
    keep[:, : first.shape[1]] = xp.where(j < n_kept[:, None], picked, -1)
    count[...] = xp.minimum(n_kept, m)


NMS = BatchedNms()
