"""A model's task, resolved against its outputs: what its answers are made of.

    task = resolve_task(entry, card, outputs)   # outputs: the engine's TensorInfo

The entry's ``task:`` and ``output:`` (``pipeline/config/tasks.py``) say what it answers and
how the output is read; what they leave out comes from the outputs and the input: one
[N, C] output is ``classify``; an output of the input's own size and channels is ``image``;
of the input's size with another channel count, ``segment``; a boxes [N, B, 4] + scores
[N, B, C] pair, ``detect`` (SSD-style); anything else ``tensors`` (v2 only). A YOLO-style
head [N, B, 4 + 1 + C] is named by ``task: detect``. Every mismatch is an ``InvalidInput``
naming the model and the shapes -- raised when the model loads, so it is refused with the
reason -- and the ingress resolves the same task from the same outputs to check a route.

A ``Task`` is small and frozen: it travels in each request's ``PostSpec`` (one object per
model, pickled once per call); the anchors stay with the config (``anchors_of``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidInput
from ..resize_plan import Target

RANGES = {"unit": (255.0, 0.0), "byte": (1.0, 0.0), "symmetric": (127.5, 127.5)}
MAX_MASK_CLASSES = 256  # a mask is one byte a pixel


@dataclass(frozen=True)
class Task:
    """What a model answers and how its outputs are read (``resolve_task``)."""

    kind: str  # classify | image | segment | detect | tensors
    model: str
    target: Target  # how the input image became the model's input (to map answers back)
    outputs: tuple[int, ...] = (0,)  # the outputs read (ssd: boxes, scores)
    layout: str = "nchw"  # image, segment: the output's layout
    channels: int = 0  # image: its channels; segment, detect: the classes
    height: int = 0  # image, segment: the output's spatial size
    width: int = 0
    scale: tuple[float, ...] = ()  # image: uint8 = output * scale + shift, per channel
    shift: tuple[float, ...] = ()
    head: str | None = None  # detect: yolo | ssd
    box_format: str = "cxcywh"
    normalized: bool = False
    objectness: bool = True
    activation: str = "none"
    background: int | None = None
    anchored: bool = False
    variances: tuple[float, ...] = (0.1, 0.1, 0.2, 0.2)
    max_candidates: int = 512

    @property
    def pixel_bytes(self) -> int:
        """Bytes of one output pixel as answered (uint8: image channels, one for a mask)."""
        return self.channels if self.kind == "image" else 1


def _fail(msg: str, entry: Any, **fields: Any) -> InvalidInput:
    return InvalidInput(f"task {entry.task or 'default'}: {msg}", model=entry.name, **fields)


def default_task(card: Any, outputs: tuple[Any, ...]) -> str:
    """The task the outputs tell, for an entry that names none."""
    first = tuple(outputs[0].shape)
    if len(first) == 2:
        return "classify"
    if default_task_is_ssd([tuple(o.shape) for o in outputs]):
        return "detect"
    if len(first) == 4:
        i = card.image
        for hw, c in ((first[2:], first[1]), (first[1:3], first[3])):
            if tuple(hw) == (i.height, i.width):
                return "image" if c == i.channels else "segment"
    return "tensors"


def _index(entry: Any, outputs: tuple[Any, ...], name: str | None, default: int) -> int:
    names = [o.name for o in outputs]
    if name is None:
        if default >= len(outputs):
            raise _fail(f"the model has {len(outputs)} output(s)", entry, outputs=names)
        return default
    if name not in names:
        raise _fail("no output of that name", entry, output=name, outputs=names)
    return names.index(name)


def _spatial(entry: Any, shape: tuple[int, ...], layout: str | None, want_c: int | None) -> str:
    """The layout of a rank-4 output: the entry's, else where ``want_c`` sits, else nchw."""
    if len(shape) != 4:
        raise _fail("the output must be [N, C, H, W] or [N, H, W, C]", entry, shape=list(shape))
    if layout is not None:
        return layout
    if want_c is not None and shape[1] != want_c and shape[3] == want_c:
        return "nhwc"
    return "nchw"


def resolve_task(entry: Any, card: Any, outputs: tuple[Any, ...]) -> Task:
    """The entry's task, checked against the model's ``outputs`` (``TensorInfo``s, batch
    first); ``InvalidInput`` naming the model and the shapes where they do not fit."""
    if not outputs:
        raise _fail("the model has no output", entry)
    kind = entry.task or default_task(card, outputs)
    out = entry.output
    base = Task(kind, entry.name, card.target())
    if kind == "classify":
        if len(outputs[0].shape) != 2:
            raise _fail(
                "classify needs an [N, classes] first output",
                entry,
                shape=list(outputs[0].shape),
                hint="name its task (image, segment, detect or tensors)",
            )
        return Task(kind, entry.name, base.target, channels=int(outputs[0].shape[-1]))
    if kind == "tensors":
        return base
    if kind == "image":
        return _image(entry, card, outputs, base)
    if kind == "segment":
        i = _index(entry, outputs, out and out.name, 0)
        shape = tuple(outputs[i].shape)
        n_labels = len(card.labels) if card.labels else None
        layout = _spatial(entry, shape, out and out.layout, n_labels or card.image.channels)
        c, h, w = (shape[1], *shape[2:]) if layout == "nchw" else (shape[3], *shape[1:3])
        if not 2 <= c <= MAX_MASK_CLASSES:
            raise _fail(
                f"a mask has 2 to {MAX_MASK_CLASSES} classes (one byte a pixel)",
                entry,
                classes=c,
                shape=list(shape),
            )
        return Task(kind, entry.name, base.target, (i,), layout, c, h, w)
    return _detect(entry, outputs, base)


def _image(entry: Any, card: Any, outputs: tuple[Any, ...], base: Task) -> Task:
    out = entry.output
    i = _index(entry, outputs, out and out.name, 0)
    shape = tuple(outputs[i].shape)
    layout = _spatial(entry, shape, out and out.layout, card.image.channels)
    c, h, w = (shape[1], *shape[2:]) if layout == "nchw" else (shape[3], *shape[1:3])
    if c not in (1, 3):
        raise _fail("an image output has 1 or 3 channels", entry, channels=c, shape=list(shape))
    rng = out.range if out is not None else "input"
    if rng == "input":
        mean = (out and out.mean) or card.image.mean
        std = (out and out.std) or card.image.std
        mean, std = _per_channel(entry, "mean", mean, c), _per_channel(entry, "std", std, c)
        scale = tuple(255.0 * s for s in std)
        shift = tuple(255.0 * m for m in mean)
        if card.input_dtype == "uint8":  # the model takes pixels as they are: 0-255 out
            scale, shift = (1.0,) * c, (0.0,) * c
    else:
        a, b = RANGES[rng]
        scale, shift = (a,) * c, (b,) * c
    return Task("image", entry.name, base.target, (i,), layout, c, h, w, scale, shift)


def _per_channel(entry: Any, what: str, v: tuple[float, ...], c: int) -> tuple[float, ...]:
    if len(v) == c:
        return tuple(v)
    if len(set(v)) == 1:
        return (v[0],) * c
    raise _fail(
        f"the input's {what} has {len(v)} values for an output of {c} channels: give output.{what}",
        entry,
        values=list(v),
        channels=c,
    )


def _detect(entry: Any, outputs: tuple[Any, ...], base: Task) -> Task:
    out = entry.output
    shapes = [tuple(o.shape) for o in outputs]
    head = out.head if out is not None and out.head else None
    if head is None:
        head = "ssd" if default_task_is_ssd(shapes) else "yolo"
    objectness = out.objectness if out is not None else True
    if head == "yolo":
        i = _index(entry, outputs, out and out.name, 0)
        s = shapes[i]
        extra = 5 if objectness else 4
        if len(s) != 3 or s[2] <= extra:
            raise _fail(
                f"a yolo head is [N, boxes, 4 + {extra - 4} + classes]", entry, shape=list(s)
            )
        idx, n_boxes, classes = (i,), s[1], s[2] - extra
    else:
        ib = _index(entry, outputs, out and out.boxes, 0)
        isc = _index(entry, outputs, out and out.scores, 1)
        b, sc = shapes[ib], shapes[isc]
        if len(b) != 3 or b[2] != 4 or len(sc) != 3 or sc[1] != b[1]:
            raise _fail(
                "an ssd head is boxes [N, boxes, 4] and scores [N, boxes, classes]",
                entry,
                boxes=list(b),
                scores=list(sc),
            )
        idx, n_boxes, classes = (ib, isc), b[1], sc[2]
    anchors = out.anchors if out is not None else None
    if anchors is not None and len(anchors) != n_boxes:
        raise _fail("one anchor a box", entry, anchors=len(anchors), boxes=n_boxes)
    background = out.background if out is not None else None
    if background is not None and background >= classes:
        raise _fail("the background class is past the classes", entry, classes=classes)
    return Task(
        "detect",
        entry.name,
        base.target,
        idx,
        channels=classes,
        head=head,
        box_format=(out and out.box_format) or ("cxcywh" if head == "yolo" else "xyxy"),
        normalized=(head == "ssd") if out is None or out.normalized is None else out.normalized,
        objectness=objectness and head == "yolo",
        activation=out.activation if out is not None else "none",
        background=background,
        anchored=anchors is not None,
        variances=tuple(out.variances) if out is not None else (0.1, 0.1, 0.2, 0.2),
        max_candidates=min(out.max_candidates if out is not None else 512, n_boxes),
    )


def default_task_is_ssd(shapes: list[tuple[int, ...]]) -> bool:
    """Two outputs [N, B, 4] and [N, B, C]: an SSD-style pair."""
    return (
        len(shapes) >= 2
        and len(shapes[0]) == 3
        and shapes[0][2] == 4
        and len(shapes[1]) == 3
        and shapes[1][1] == shapes[0][1]
    )


def anchors_of(entry: Any) -> np.ndarray | None:
    """The entry's anchors as float32 [B, 4] (cx, cy, w, h), or None."""
    out = entry.output
    if out is None or out.anchors is None:
        return None
    return np.asarray(out.anchors, np.float32).reshape(-1, 4)


def labelled_classes(task: Task, outputs: tuple[Any, ...]) -> int | None:
    """How many labels a labels file must have for this task (None: not checked)."""
    if task.kind in ("segment", "detect"):
        return task.channels
    if task.kind in ("classify", "tensors"):
        return int(outputs[0].shape[-1])
    return None
