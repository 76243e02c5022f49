"""What one request asks of a task's answer (``TaskOptions``), read from its query and its
``Accept`` header, and the memory that answer will take -- checked before the request is
admitted (``check_work``: 413 naming the bytes), like a decode's.

    opts = parse_options("image", request.query_params, accept)   # before the body is read
    opts = for_image(opts, h, w, "jpeg")                           # from its header
    check_work(task, opts, max_work_bytes)

Pure functions of untrusted strings: every bad value is a 400 naming it, an ``Accept`` no
encoder serves a 406.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from ..errors import InvalidInput, NotAcceptable, PayloadTooLarge
from ..resize_plan import plan_resize
from .encode import MEDIA_TYPES, available_media_types
from .spec import Task

ROUTES = ("image", "segment", "detect")  # the v1 routes of the tasks beyond classify
PARAMS = {
    "image": {"quality", "size"},
    "segment": {"format"},
    "detect": {"score_threshold", "iou_threshold", "max_boxes"},
}
COMMON = {"deadline_ms", "priority"}  # read by the ingress, as for classify
MAX_BOXES = 1000


@dataclass(frozen=True)
class TaskOptions:
    """One request's options: the input image's size (from its header), and per task what
    it asked (defaults where it did not)."""

    source: tuple[int, int]  # (height, width) of the input image
    media_type: str | None = None  # image: the encoder (None: the input's format)
    quality: int = 90  # image: JPEG and WebP quality
    size: str = "input"  # image: input (resized back) | model (as the model made it)
    format: str = "png"  # segment: png (the mask) | json (class areas)
    score_threshold: float = 0.25  # detect
    iou_threshold: float = 0.45
    max_boxes: int = 100

    def nms_key(self) -> tuple[float, float, int]:
        """Requests with the same key share one batched NMS."""
        return self.score_threshold, self.iou_threshold, self.max_boxes


def _int(raw: str, what: str, lo: int, hi: int) -> int:
    try:
        v = int(raw)
    except ValueError:
        raise InvalidInput(f"{what} must be an integer", **{what: raw[:40]}) from None
    if not lo <= v <= hi:
        raise InvalidInput(f"{what} out of range", **{what: v, "min": lo, "max": hi})
    return v


def _unit(raw: str, what: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise InvalidInput(f"{what} must be a number", **{what: raw[:40]}) from None
    if not 0.0 <= v <= 1.0:  # (NaN fails this too)
        raise InvalidInput(f"{what} out of range [0, 1]", **{what: raw[:40]})
    return v


def _choice(raw: str, what: str, allowed: tuple[str, ...]) -> str:
    if raw not in allowed:
        raise InvalidInput(f"{what} must be one of {list(allowed)}", **{what: raw[:40]})
    return raw


def negotiate(accept: str | None) -> str | None:
    """The media type to answer in: the first of ``Accept`` (by its q values, then its
    order) that has an encoder; None -- the input's own format -- where none is given or
    ``*/*`` or ``image/*`` comes first. 406 when ``Accept`` names only types without one."""
    if not accept:
        return None
    ranked: list[tuple[float, int, str]] = []
    for i, part in enumerate(accept.split(",")[:32]):
        fields = [f.strip() for f in part.split(";")]
        q = 1.0
        for f in fields[1:]:
            if f.startswith("q="):
                try:
                    q = float(f[2:])
                except ValueError:
                    q = 0.0
        if q > 0 and fields[0]:
            ranked.append((-q, i, fields[0].lower()))
    have = available_media_types()
    for _, _, mt in sorted(ranked):
        if mt in ("*/*", "image/*"):
            return None
        if mt in have:
            return mt
    raise NotAcceptable(
        "no encoder for the media types Accept names", accept=accept[:160], available=have
    )


def parse_options(kind: str, query: Mapping[str, str], accept: str | None) -> TaskOptions:
    """A request's options for task route ``kind`` from its query and ``Accept``, checked
    before its body is read; ``for_image`` completes them from the image's header."""
    unknown = sorted(set(query) - PARAMS[kind] - COMMON)
    if unknown:
        raise InvalidInput(
            "unknown query parameter", parameter=unknown[0][:40], allowed=sorted(PARAMS[kind])
        )
    q = query.get
    if kind == "image":
        return TaskOptions(
            (0, 0),
            media_type=negotiate(accept),
            quality=_int(q("quality", "90"), "quality", 1, 100),
            size=_choice(q("size", "input"), "size", ("input", "model")),
        )
    if kind == "segment":
        return TaskOptions((0, 0), format=_choice(q("format", "png"), "format", ("png", "json")))
    return TaskOptions(
        (0, 0),
        score_threshold=_unit(q("score_threshold", "0.25"), "score_threshold"),
        iou_threshold=_unit(q("iou_threshold", "0.45"), "iou_threshold"),
        max_boxes=_int(q("max_boxes", "100"), "max_boxes", 1, MAX_BOXES),
    )


def for_image(opts: TaskOptions, height: int, width: int, image_kind: str) -> TaskOptions:
    """``opts`` for an input image of ``height`` x ``width`` in format ``image_kind``
    (``jpeg``, ``png``): an image answer without a media type asked is in the input's."""
    own = "image/jpeg" if image_kind == "jpeg" else "image/png"
    return replace(opts, source=(height, width), media_type=opts.media_type or own)


def answer_size(task: Task, opts: TaskOptions) -> tuple[int, int]:
    """(height, width) of the image or mask answered: the model's output, or the part of
    the input it covers (the whole input unless the model's input was a centre crop)."""
    if task.kind == "image" and opts.size == "model":
        return task.height, task.width
    h, w = opts.source
    p = plan_resize(h, w, task.target)
    if task.target.fit != "center_crop":
        return h, w
    sy, sx = p.scale
    return max(1, round(p.out_h * sy)), max(1, round(p.out_w * sx))


def work_bytes(task: Task, opts: TaskOptions) -> int:
    """What answering one request holds at its peak beyond the model's output: the answer's
    pixels, the resize's float64 intermediate and output (numpy's), and the encoder's
    buffer (at most the raw pixels again). Detection's answer is its boxes: fixed."""
    if task.kind not in ("image", "segment"):
        return 0
    h, w = answer_size(task, opts)
    c = task.pixel_bytes
    pixels = h * w * c
    resize = 0 if (h, w) == (task.height, task.width) else 8 * (h * task.width + h * w) * c
    return pixels + resize + pixels


def check_work(task: Task, opts: TaskOptions, max_work_bytes: int) -> None:
    """413 when the answer would hold more than ``max_work_bytes`` (the decode's limit)."""
    need = work_bytes(task, opts)
    if need > max_work_bytes:
        h, w = answer_size(task, opts)
        raise PayloadTooLarge(
            "answering this image would need more memory than allowed",
            answer_height=h,
            answer_width=w,
            work_bytes=need,
            max_work_bytes=max_work_bytes,
            hint="size=model" if task.kind == "image" else None,
        )


__all__ = ["MEDIA_TYPES", "TaskOptions", "check_work", "for_image", "negotiate", "parse_options"]
