"""What a model answers (its ``task``) and how its output is read (``output:``).

The shape of the options and their values only: whether the model's outputs fit the task is
checked when it loads (``pipeline.tasks.resolve``), with the model named and the shapes."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .base import Strict

TaskName = Literal["classify", "image", "segment", "detect", "tensors"]
TASKS: tuple[str, ...] = ("classify", "image", "segment", "detect", "tensors")

# which options each task reads (a field given for another task is refused, named)
_TASK_FIELDS = {
    "image": {"name", "layout", "range", "mean", "std"},
    "segment": {"name", "layout"},
    "detect": {
        "name",
        "boxes",
        "scores",
        "head",
        "box_format",
        "normalized",
        "objectness",
        "activation",
        "background",
        "anchors",
        "variances",
        "max_candidates",
    },
}


class TaskOutputConfig(Strict):
    """How a model's output is read for its task; every field left out has a default from
    the model's outputs and its input (docs/models.md, "Tasks")."""

    name: str | None = None
    """``image``, ``segment``, ``detect`` (``yolo``): the output tensor to read, by name;
    ``None``: the model's first output."""
    layout: Literal["nchw", "nhwc"] | None = None
    """``image``, ``segment``: the output's layout; ``None``: ``nchw`` unless the last axis
    is the channels (image: the input's channel count; segment: the labels' count)."""
    range: Literal["input", "unit", "byte", "symmetric"] = "input"
    """``image``: what the output's values mean. ``input``: the input's own normalisation
    (its mean/std, on the [0, 1] scale) is undone -- an image-to-image network needs nothing
    more; ``unit``: [0, 1]; ``byte``: [0, 255]; ``symmetric``: [-1, 1]. Clipped to 0-255."""
    mean: tuple[float, ...] | None = None
    """``image``: a mean to undo in place of the input's (on the [0, 1] scale)."""
    std: tuple[float, ...] | None = None
    """``image``: a std to undo in place of the input's (on the [0, 1] scale)."""
    head: Literal["yolo", "ssd"] | None = None
    """``detect``: ``yolo``, one output [N, boxes, 4 + 1 + classes] (box, objectness, class
    scores; 4 + classes with ``objectness: false``); ``ssd``, two outputs, ``boxes``
    [N, boxes, 4] and ``scores`` [N, boxes, classes]. ``None``: from the outputs."""
    boxes: str | None = None
    """``detect`` (``ssd``): the boxes output's name; ``None``: the first output."""
    scores: str | None = None
    """``detect`` (``ssd``): the scores output's name; ``None``: the second output."""
    box_format: Literal["cxcywh", "xyxy"] | None = None
    """``detect``: the four numbers of a box (with ``anchors``: offsets from the anchor in
    SSD's encoding, always cx, cy, w, h); ``None``: ``cxcywh`` (yolo), ``xyxy`` (ssd)."""
    normalized: bool | None = None
    """``detect``: boxes (and anchors) on the [0, 1] scale of the model's input; ``None``:
    pixels of the model's input for ``yolo``, [0, 1] for ``ssd``."""
    objectness: bool = True
    """``detect`` (``yolo``): the fifth number is an objectness score multiplied into the
    class scores."""
    activation: Literal["none", "sigmoid", "softmax"] = "none"
    """``detect``: applied to the raw scores (and objectness) first; ``none``: they are
    probabilities already."""
    background: int | None = Field(None, ge=0)
    """``detect``: a class index that is background, never a box (SSD's 0)."""
    anchors: tuple[tuple[float, float, float, float], ...] | None = None
    """``detect``: one (cx, cy, w, h) prior per box, on the scale ``normalized`` says; the
    box numbers are then offsets from it (SSD: ``cx = a.cx + d.x * v0 * a.w``, ``w = a.w *
    exp(d.w * v2)``). ``None``: the boxes are the boxes."""
    variances: tuple[float, float, float, float] = (0.1, 0.1, 0.2, 0.2)
    """``detect`` with ``anchors``: SSD's variances of the offsets."""
    max_candidates: int = Field(512, ge=1, le=4096)
    """``detect``: the highest-scoring boxes of an image that NMS considers (its work and
    memory are fixed by this: candidates squared per image)."""

    @model_validator(mode="after")
    def _positive_std(self) -> TaskOutputConfig:
        if self.std is not None and any(x <= 0 for x in self.std):
            raise ValueError(f"output.std must be positive, got {self.std}")
        if any(v <= 0 for v in self.variances):
            raise ValueError(f"output.variances must be positive, got {self.variances}")
        return self

    def given(self) -> set[str]:
        """The fields the entry set (the others are defaults)."""
        return set(self.model_fields_set)


def check_task_fields(model: str, task: str | None, output: TaskOutputConfig | None) -> None:
    """``ValueError`` when ``output`` sets a field its task does not read (or there is no
    task to read it)."""
    if output is None:
        return
    given = output.given()
    if given and task not in _TASK_FIELDS:
        raise ValueError(
            f"model {model!r}: output: is read by the tasks image, segment and detect, "
            f"not by task {task!r} (give task: explicitly)"
        )
    wrong = sorted(given - _TASK_FIELDS.get(task or "", set()))
    if wrong:
        raise ValueError(f"model {model!r}: output.{wrong[0]} is not read by task {task!r}")
