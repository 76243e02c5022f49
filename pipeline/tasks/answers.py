"""The answers of the tasks beyond classify, made from a call's model outputs in one go:
each step runs once over every row of the call that asks it (``Denormalize``, ``ArgmaxMask``,
``BatchedNms``: Ferry's ops, on the arrays' own backend), then each request's answer is
resized back to its input (``resize_crop`` for pixels, ``resize_nearest`` for a mask) and
the call's images are encoded together on a pool of threads -- or, for JPEG answers where
the context has a device answerer (``encode_device``), resized and encoded on the GPU.

    made = answer_tasks(ctx, logits, specs, rows_of, skip)   # request -> Made | FerryError
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import FerryError, ResourceExhausted
from ..ops.base import eager
from ..ops.denormalize import DENORMALIZE
from ..ops.mask import ARGMAX_MASK, RESIZE_NEAREST, nearest_indices
from ..ops.resize_crop import RESIZE_CROP
from ..resize_plan import plan_resize
from .detect import detections
from .encode import encode_many
from .options import TaskOptions, answer_size
from .spec import Task

logger = logging.getLogger(__name__)
KINDS = ("image", "segment", "detect")


@dataclass
class Made:
    """One request's answer to its task: encoded bytes (an image, a mask) or JSON."""

    media: bytes | None = None
    media_type: str | None = None
    result: dict[str, Any] | None = None


@dataclass
class TaskContext:
    """What the answering stage holds for the tasks: the labels and anchors of its models
    (by name), the pool its encoders run on and its device answerer (None: the CPU's)."""

    label: dict[str, Callable[[int], str]]
    anchors: dict[str, np.ndarray | None] = field(default_factory=dict)
    pool: ThreadPoolExecutor | None = None
    device: Any = None  # encode_device.DeviceAnswers


def window(task: Task, source: tuple[int, int]) -> tuple[int, int, int, int]:
    """(top, left, height, width) of the model's output that covers the input image: the
    whole output, less a letterbox's padding (in the output's own pixels)."""
    t = task.target
    p = plan_resize(*source, t)
    fy, fx = task.height / t.height, task.width / t.width  # output pixels per input pixel
    top, left = (t.height - p.out_h) // 2, (t.width - p.out_w) // 2
    return (
        round(top * fy),
        round(left * fx),
        max(1, round(p.out_h * fy)),
        max(1, round(p.out_w * fx)),
    )


def _window_of(
    task: Task, img: np.ndarray, opts: TaskOptions
) -> tuple[np.ndarray, tuple[int, int]]:
    """The part of one image [H, W, C] of the model's output that the answer shows, and the
    answer's (height, width)."""
    if opts.size == "model":
        return img, (task.height, task.width)
    top, left, wh, ww = window(task, opts.source)
    return img[top : top + wh, left : left + ww], answer_size(task, opts)


def _image_back(task: Task, img: np.ndarray, opts: TaskOptions) -> np.ndarray:
    """One image [H, W, C] of the model's output at the size the request asked."""
    win, (ah, aw) = _window_of(task, img, opts)
    if win.shape[:2] == (ah, aw):
        return np.ascontiguousarray(win)
    (out,) = eager(RESIZE_CROP, win, height=ah, width=aw, channels=task.channels)
    return out[0]


def _mask_back(task: Task, mask: np.ndarray, opts: TaskOptions) -> np.ndarray:
    ah, aw = answer_size(task, opts)
    w = window(task, opts.source)
    if w == (0, 0, ah, aw) and mask.shape == (ah, aw):
        return mask
    (out,) = eager(RESIZE_NEAREST, mask, height=ah, width=aw, window=w)
    return out


_said = [float("-inf")]  # when _cpu_instead last warned (-inf: monotonic may start below 60)


def _cpu_instead(exc: BaseException) -> None:
    """Say why a call's JPEGs went the CPU's way -- the pool or the staging ring had no
    room now, or the device path failed: as a warning at most once a minute, else at
    debug (a full pool under load would say it every call)."""
    now = time.monotonic()
    quiet = now - _said[0] < 60.0
    logger.log(
        logging.DEBUG if quiet else logging.WARNING,
        "image answers on the CPU: %s",
        exc,
        exc_info=not isinstance(exc, ResourceExhausted),  # (the full pool is no bug)
    )
    if not quiet:
        _said[0] = now


def _images(ctx: TaskContext, task: Task, out: np.ndarray, opts: list[TaskOptions]) -> list[Made]:
    pixels = out  # uint8 [N, H, W, C]: denormalised on the device already (the epilogue)
    if out.dtype != np.uint8:
        (pixels,) = eager(DENORMALIZE, out, layout=task.layout, scale=task.scale, shift=task.shift)
    media = [o.media_type for o in opts]
    data: list[bytes | None] = [None] * len(opts)
    if ctx.device is not None:  # JPEGs resized and encoded on the GPU
        on = [i for i, m in enumerate(media) if m == "image/jpeg"]
        wins = [_window_of(task, pixels[i], opts[i]) for i in on]
        try:
            got = ctx.device.jpegs(
                [w for w, _ in wins], [s for _, s in wins], [opts[i].quality for i in on]
            )
        except Exception as exc:  # the pool or ring full, the encoder failing: made anyway
            _cpu_instead(exc)
            got = [None] * len(on)
        for i, d in zip(on, got, strict=True):
            data[i] = d
    rest = [i for i, d in enumerate(data) if d is None]  # on the CPU (and any GPU refusal)
    imgs = [_image_back(task, pixels[i], opts[i]) for i in rest]
    cpu = encode_many(ctx.pool, imgs, [media[i] for i in rest], [opts[i].quality for i in rest])
    for i, d in zip(rest, cpu, strict=True):
        data[i] = d
    return [Made(d, m) for d, m in zip(data, media, strict=True)]


def _area_json(
    ctx: TaskContext, task: Task, counts: np.ndarray, height: int, width: int
) -> dict[str, Any]:
    total = height * width
    label = ctx.label[task.model]
    return {
        "height": height,
        "width": width,
        "classes": [
            {"class": c, "label": label(c), "pixels": int(n), "fraction": round(n / total, 6)}
            for c, n in enumerate(counts.tolist())
            if n
        ],
    }


def _areas_of(ctx: TaskContext, task: Task, mask: np.ndarray, opts: TaskOptions) -> dict:
    """The class areas of the mask answered (``_mask_back``'s), from the model's mask
    without making it: each pixel of the window counts as many answer pixels as its
    nearest-neighbour rows and columns (``nearest_indices``) give it -- the same integers as
    counting the answer's pixels, without them."""
    ah, aw = answer_size(task, opts)
    top, left, wh, ww = window(task, opts.source)
    rows = np.bincount(nearest_indices(mask.shape[0], top, wh, ah) - top, minlength=wh)
    cols = np.bincount(nearest_indices(mask.shape[1], left, ww, aw) - left, minlength=ww)
    win = mask[top : top + wh, left : left + ww]
    weight = np.outer(rows, cols).ravel().astype(np.float64)
    counts = np.bincount(win.ravel(), weights=weight, minlength=task.channels)
    return _area_json(ctx, task, np.rint(counts).astype(np.int64), ah, aw)


def _segments(ctx: TaskContext, task: Task, out: np.ndarray, opts: list[TaskOptions]) -> list[Made]:
    masks = out  # uint8 [N, H, W]: the epilogue's argmax, on the device
    if out.dtype != np.uint8:
        (masks,) = eager(ARGMAX_MASK, out, layout=task.layout)
    made: list[Made] = []
    pngs, back = [], []
    for i, o in enumerate(opts):
        if o.format == "png":
            pngs.append(i)
            back.append(_mask_back(task, masks[i], o))
            made.append(Made())
        else:  # class areas: counted on the model's mask, no answer pixels made
            made.append(Made(result=_areas_of(ctx, task, masks[i], o)))
    data = encode_many(ctx.pool, back, ["image/png"] * len(pngs), [0] * len(pngs))
    for i, d in zip(pngs, data, strict=True):
        made[i] = Made(d, "image/png")
    return made


def answer_tasks(
    ctx: TaskContext,
    outputs: tuple[np.ndarray, ...],
    specs: list[Any],
    rows_of: dict[int, list[int]],
    skip: set[int],
    on_device: bool = False,
) -> dict[int, Made | FerryError]:
    """Every task request's answer (by request index), but those in ``skip``: ``outputs``
    are the call's model outputs, row for row (``rows_of``: each request's rows) -- or,
    ``on_device``, what the task's epilogue made (an image's or a mask's bytes, a detection
    head's boxes)."""
    done: dict[int, Made | FerryError] = {}
    for kind in KINDS:
        reqs = [r for r, s in enumerate(specs) if s.kind == kind and r not in skip]
        if not reqs:
            continue
        task: Task = specs[reqs[0]].task
        sel = [rows_of[r][0] for r in reqs]
        read = (0,) if on_device and kind in KINDS else task.outputs
        arrays = tuple(outputs[i][sel] for i in read)
        opts = [specs[r].options for r in reqs]
        try:
            if kind == "image":
                made = _images(ctx, task, arrays[0], opts)
            elif kind == "segment":
                made = _segments(ctx, task, arrays[0], opts)
            else:
                anchors = ctx.anchors.get(task.model)
                made = [
                    Made(result=d)
                    for d in detections(
                        task, arrays, anchors, opts, ctx.label[task.model], on_device
                    )
                ]
        except FerryError as exc:  # the kind's requests fail together, the others answer
            done.update({r: exc for r in reqs})
            continue
        done.update(zip(reqs, made, strict=True))
    return done
