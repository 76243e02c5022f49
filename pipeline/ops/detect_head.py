"""DetectHead: a YOLO-style detection head [N, B, 4 (+ 1) + C] -> float32 [N, B, 6], each
box as (x0, y0, x1, y1, score, class) in the model input's pixels; with ``keep=K`` (a
``detect`` task's ``max_candidates``) [N, K, 6], each image's K best boxes, best first
(``top_rows``: the boxes NMS considers, in the order it takes them).

A detection model's answer depends on each request's thresholds, so NMS stays with the
answers; what needs nothing of the request -- each box's best class and score, its corners
-- is this op, which a ``detect`` task's epilogue runs on the device right after the model
(``engines/epilogue.py``). Which boxes NMS considers needs nothing of the request either
(the ``max_candidates`` best, whatever the threshold: those at or above any threshold lead
them), so with ``keep`` the op also ranks each image's boxes and keeps those. The host then
reads 24 bytes a candidate box, not 4 a class score of every box, and never touches the
class scores. The answering stage runs the same op on numpy where no epilogue
ran, so both paths answer alike.

A box's class is the one with the highest raw class score: with ``activation: sigmoid`` and
a sigmoid objectness every class of a box is scaled alike, so that is the class of the
highest score (where sigmoid saturates two raw scores to one float, the higher raw one wins,
not the first). With raw scores times a raw objectness (``activation: none``), a negative
objectness makes the lowest raw score the highest, and at 0 every class scores 0 and the
first wins, as the scores' own argmax would give. The score is then that class's, times the
objectness. Softmax heads, heads with a background class and anchored (SSD) heads are
decoded on the host (``tasks/detect.py``).

One code path for both backends (``xp`` is numpy or cupy), into the output and the
workspace only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput
from .base import FLOAT_DTYPES, OpPlan, TensorSpec, XpOp, align, check_tensor, workspace_view
from .top_rows import MAX_K, top_rows

ACTIVATIONS = ("none", "sigmoid")
BOX_FORMATS = ("cxcywh", "xyxy")


@dataclass(frozen=True)
class _Detail:
    first: int  # where the class scores start (5 with objectness, else 4)
    objectness: bool
    activation: str
    box_format: str
    scale: tuple[float, float] | None  # (width, height) for normalised boxes
    n: int
    b: int
    keep: int | None  # each image's best boxes kept, ranked (None: every box, in order)
    offsets: tuple[int, ...]  # idx, alt, m, mn (x's dtype), best, obj, half, mask, boxes


class DetectHead(XpOp):
    name = "detect_head"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 3, FLOAT_DTYPES)
        objectness = bool(attrs.get("objectness", True))
        activation = attrs.get("activation", "none")
        box_format = attrs.get("box_format", "cxcywh")
        scale = attrs.get("scale")
        if activation not in ACTIVATIONS or box_format not in BOX_FORMATS:
            raise InvalidInput(
                "detect_head: activation none or sigmoid, box_format cxcywh or xyxy",
                activation=activation,
                box_format=box_format,
            )
        n, b, k = x.shape
        first = 5 if objectness else 4
        if k <= first:
            raise InvalidInput("detect_head: no class scores past the box", values=k, first=first)
        if scale is not None:
            scale = (float(scale[0]), float(scale[1]))
        keep = attrs.get("keep")
        if keep is not None:
            keep = min(int(keep), b)
            if not 1 <= keep <= MAX_K:
                raise InvalidInput(f"detect_head: keep in [1, {MAX_K}]", keep=keep)
        item = TensorSpec((n, b), x.dtype).nbytes
        every = 0 if keep is None else 24 * n * b  # every box, before the ranking
        sizes = (8 * n * b, 8 * n * b, item, item, 4 * n * b, 4 * n * b, 4 * n * b, n * b, every)
        offsets, at = [], 0
        for s in sizes:
            offsets.append(at)
            at = align(at + s)
        detail = _Detail(
            first, objectness, activation, box_format, scale, n, b, keep, tuple(offsets)
        )
        return OpPlan(
            self.name,
            specs,
            (TensorSpec((n, b if keep is None else keep, 6), "float32"),),
            at,
            flops=x.size * 2,
            bytes_moved=x.nbytes + n * b * 24,
            attrs=(
                ("objectness", objectness),
                ("activation", activation),
                ("box_format", box_format),
                ("scale", scale),
                ("keep", keep),
            ),
            detail=detail,
        )

    def run_xp(
        self, xp: Any, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        detect_head(xp, plan.detail, inputs[0], outputs[0], workspace)


def _sigmoid(xp: Any, v: Any) -> None:
    """``v`` = 1 / (1 + exp(-v)), in place (as ``tasks/detect.py`` computes it on the host)."""
    xp.negative(v, out=v)
    xp.exp(v, out=v)
    xp.add(v, 1.0, out=v)
    xp.reciprocal(v, out=v)


def detect_head(xp: Any, d: _Detail, x: Any, out: Any, ws: Any) -> None:
    shape = (d.n, d.b)
    o_idx, o_alt, o_m, o_mn, o_best, o_obj, o_half, o_mask, o_boxes = d.offsets
    y = out if d.keep is None else workspace_view(ws, o_boxes, (d.n, d.b, 6), "float32")
    idx = workspace_view(ws, o_idx, shape, "int64")
    m = workspace_view(ws, o_m, shape, x.dtype)
    best = workspace_view(ws, o_best, shape, "float32")
    cls = x[..., d.first :]
    xp.argmax(cls, axis=-1, out=idx)
    xp.amax(cls, axis=-1, out=m)
    xp.copyto(best, m)
    if d.activation == "sigmoid":
        _sigmoid(xp, best)
    if d.objectness:
        obj = workspace_view(ws, o_obj, shape, "float32")
        xp.copyto(obj, x[..., 4])
        if d.activation == "sigmoid":
            _sigmoid(xp, obj)
        else:  # a raw objectness may be negative, or 0
            alt = workspace_view(ws, o_alt, shape, "int64")
            mn = workspace_view(ws, o_mn, shape, x.dtype)
            mask = workspace_view(ws, o_mask, shape, "bool")
            xp.argmin(cls, axis=-1, out=alt)
            xp.amin(cls, axis=-1, out=mn)
            xp.less(obj, 0.0, out=mask)
            xp.copyto(idx, alt, where=mask)
            xp.copyto(best, mn, where=mask)
            xp.equal(obj, 0.0, out=mask)
            xp.copyto(idx, 0, where=mask)
        xp.multiply(best, obj, out=best)
    box = x[..., :4]
    if d.box_format == "cxcywh":
        half = workspace_view(ws, o_half, shape, "float32")
        for c, s in ((0, 2), (1, 3)):
            xp.copyto(half, box[..., s])
            xp.multiply(half, 0.5, out=half)
            xp.subtract(box[..., c], half, out=y[..., c])
            xp.add(box[..., c], half, out=y[..., c + 2])
    else:
        xp.copyto(y[..., :4], box)
    if d.scale is not None:
        xp.multiply(y[..., 0:4:2], d.scale[0], out=y[..., 0:4:2])
        xp.multiply(y[..., 1:4:2], d.scale[1], out=y[..., 1:4:2])
    xp.copyto(y[..., 4], best)
    xp.copyto(y[..., 5], idx, casting="unsafe")
    if d.keep is not None:
        top_rows(xp, y, out, 4)


DETECT_HEAD = DetectHead()


def head_attrs(task: Any) -> dict[str, Any] | None:
    """The op's attrs for a ``detect`` task's head, or None where the host decodes it (an
    SSD pair, anchors, a background class, softmax scores)."""
    if (
        task.kind != "detect"
        or task.head != "yolo"
        or task.anchored
        or task.background is not None
        or task.activation not in ACTIVATIONS
        or task.box_format not in BOX_FORMATS
    ):
        return None
    t = task.target
    return {
        "objectness": bool(task.objectness),
        "activation": task.activation,
        "box_format": task.box_format,
        "scale": (float(t.width), float(t.height)) if task.normalized else None,
        "keep": int(task.max_candidates),
    }
