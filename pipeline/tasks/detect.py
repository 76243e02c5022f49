"""Detection heads decoded into boxes in the input image's pixels.

A YOLO-style head [N, B, 4 + 1 + C] (box, objectness, class scores) or an SSD-style pair,
boxes [N, B, 4] and scores [N, B, C]; with anchors the box numbers are SSD's offsets from
one prior a box. Each box keeps its best class (a background class never wins); the boxes
of a call go through one ``BatchedNms`` per distinct (score threshold, IoU threshold, max
boxes) -- one for the whole call when every request takes the defaults -- and each kept box
is mapped back through the resize that made the model's input (stretch, letterbox or
centre crop) to the input image's pixels, clipped to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..ops.base import eager
from ..ops.detect_head import DETECT_HEAD, head_attrs
from ..ops.nms import NMS
from ..resize_plan import plan_resize
from .options import TaskOptions
from .spec import Task


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def class_scores(task: Task, raw: np.ndarray, obj: np.ndarray | None) -> np.ndarray:
    """[N, B, C] scores from the head's raw numbers (activation, objectness)."""
    if task.activation == "sigmoid":
        raw = _sigmoid(raw)
        obj = None if obj is None else _sigmoid(obj)
    elif task.activation == "softmax":
        raw = _softmax(raw)
        obj = None if obj is None else _sigmoid(obj)
    return raw if obj is None else raw * obj[..., None]


def decode_boxes(task: Task, raw: np.ndarray, anchors: np.ndarray | None) -> np.ndarray:
    """[N, B, 4] head numbers -> (x0, y0, x1, y1) in the model input's pixels (float64)."""
    d = raw.astype(np.float64)
    if anchors is not None:  # SSD's offsets from each prior (cx, cy, w, h)
        a = anchors.astype(np.float64)[None]
        v = task.variances
        cx = a[..., 0] + d[..., 0] * v[0] * a[..., 2]
        cy = a[..., 1] + d[..., 1] * v[1] * a[..., 3]
        w = a[..., 2] * np.exp(d[..., 2] * v[2])
        h = a[..., 3] * np.exp(d[..., 3] * v[3])
        d = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    elif task.box_format == "cxcywh":
        cx, cy, w, h = (d[..., i] for i in range(4))
        d = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=-1)
    if task.normalized:
        t = task.target
        d = d * np.array([t.width, t.height, t.width, t.height], np.float64)
    return d


def decoded(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``DetectHead``'s [N, B, 6] as (boxes [N, B, 4], scores [N, B], classes [N, B] int32)."""
    return y[..., :4], y[..., 4], y[..., 5].astype(np.int32)


def head_outputs(
    task: Task, arrays: tuple[np.ndarray, ...], anchors: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(boxes [N, B, 4] in model pixels, best score [N, B] float32, its class [N, B]
    int32): ``DetectHead`` where it takes the head (as the task's epilogue would have on the
    device), else decoded here."""
    attrs = head_attrs(task)
    if attrs is not None:
        (y,) = eager(DETECT_HEAD, np.ascontiguousarray(arrays[0]), **attrs)
        return decoded(y)
    if task.head == "yolo":
        out = np.asarray(arrays[0], np.float32)
        raw_box = out[..., :4]
        obj = out[..., 4] if task.objectness else None
        cls_raw = out[..., 5:] if task.objectness else out[..., 4:]
    else:
        raw_box = np.asarray(arrays[0], np.float32)
        obj, cls_raw = None, np.asarray(arrays[1], np.float32)
    scores = class_scores(task, cls_raw, obj)
    if task.background is not None:
        scores = scores.copy()
        scores[..., task.background] = -np.inf
    best = scores.argmax(axis=-1).astype(np.int32)
    score = np.take_along_axis(scores, best[..., None].astype(np.int64), axis=-1)[..., 0]
    return decode_boxes(task, raw_box, anchors), score.astype(np.float32), best


def to_source(task: Task, boxes: np.ndarray, source: tuple[int, int]) -> np.ndarray:
    """Boxes [K, 4] in the model input's pixels -> the input image's pixels, clipped."""
    t = task.target
    h, w = source
    p = plan_resize(h, w, t)
    pad_top, pad_left = (t.height - p.out_h) // 2, (t.width - p.out_w) // 2
    sy, sx = p.scale
    boxes = np.asarray(boxes, np.float64)  # (DetectHead's are float32)
    out = np.empty_like(boxes)
    out[:, 0::2] = (boxes[:, 0::2] - pad_left + p.left) * sx
    out[:, 1::2] = (boxes[:, 1::2] - pad_top + p.top) * sy
    out[:, 0::2] = np.clip(out[:, 0::2], 0, w)
    out[:, 1::2] = np.clip(out[:, 1::2], 0, h)
    return out


def detections(
    task: Task,
    arrays: tuple[np.ndarray, ...],
    anchors: np.ndarray | None,
    opts: list[TaskOptions],
    label: Callable[[int], str],
    on_device: bool = False,
) -> list[dict[str, Any]]:
    """Each request's answer: its boxes, best first, in its input image's pixels;
    ``on_device``: ``arrays[0]`` is what the task's epilogue made (``DetectHead``)."""
    if on_device:
        boxes, scores, classes = decoded(arrays[0])
    else:
        boxes, scores, classes = head_outputs(task, arrays, anchors)
    nms_boxes = boxes.astype(np.float32)
    groups: dict[tuple, list[int]] = {}
    for i, o in enumerate(opts):
        groups.setdefault(o.nms_key(), []).append(i)
    out: list[dict[str, Any]] = [{}] * len(opts)
    for (score_thr, iou_thr, max_boxes), rows in groups.items():
        keep, count = eager(
            NMS,
            nms_boxes[rows],
            scores[rows],
            classes[rows],
            iou_threshold=iou_thr,
            score_threshold=score_thr,
            max_candidates=task.max_candidates,
            max_boxes=max_boxes,
        )
        for j, i in enumerate(rows):
            idx = keep[j, : int(count[j])]
            src = to_source(task, boxes[i, idx], opts[i].source)
            out[i] = {
                "boxes": [
                    {
                        "box": [round(float(v), 2) for v in b],
                        "score": round(float(scores[i, k]), 6),
                        "class": int(classes[i, k]),
                        "label": label(int(classes[i, k])),
                    }
                    for b, k in zip(src, idx.tolist(), strict=True)
                ],
                "height": opts[i].source[0],
                "width": opts[i].source[1],
            }
    return out
