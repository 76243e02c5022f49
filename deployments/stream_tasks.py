"""What a stream's frames ask of the ingress, task by task: the one place where a task's
request and answer plug into the stream route (``streams_route.py``), which knows no task.

A ``StreamTask`` is what its own HTTP route does with one image, cut in three: ``read``, its
options from the stream's query (checked once, at the handshake, as the route checks its
parameters: ``pipeline/tasks/options.py`` for ``image``, ``segment``, ``detect``);
``FramePlan.spec_for``, each frame's ``PostSpec`` from that frame's own size and format (its
answer's memory checked: a 413 for that frame alone); ``fields``, the answer as the route
answers it -- JSON fields, or an encoded image (or mask) that follows its JSON header as one
binary message. Every task's images ride the ingress's classify coalescer, as every v1
image route's do (``Ingress.by_image``). ``ask`` hands one frame to the ingress and gives
back the future of its answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.errors import FerryError, InvalidInput, Unavailable
from pipeline.stages.messages import Answer, Encoded, ImageRequest, PostSpec, RequestMeta
from pipeline.tasks.options import PARAMS, TaskOptions, check_work, for_image, parse_options
from pipeline.tasks.spec import Task

from .http_errors import unwrap

STREAM_PARAMS = frozenset({"task", "format", "fps", "deadline_ms"})  # the stream's own terms
IMAGE_FORMATS = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
COALESCER = "classify"  # the ingress's coalescer every v1 image route's images ride


@dataclass(frozen=True)
class StreamTask:
    """One task as streams serve it: its formats and its route's own parameters, and how
    the handshake reads them (``read``: the ``PostSpec`` of every frame for classify, the
    route's ``TaskOptions`` for the others)."""

    name: str
    formats: tuple[str, ...]  # the ``format`` values it offers
    default_format: str | None  # without ``format``; None: each frame's own (image)
    params: frozenset[str]  # its own query parameters (as its route reads them)
    read: Callable[[Any, str, Mapping[str, str], str | None], TaskOptions | PostSpec]


@dataclass(frozen=True)
class FramePlan:
    """What every frame of one stream asks, fixed at its handshake: its task, and either
    the one ``PostSpec`` of all its frames (classify) or the options each frame's own spec
    is made from (``spec_for``)."""

    task: StreamTask
    format: str | None
    spec: PostSpec | None = None  # classify: the same for every frame
    model_task: Task | None = None  # image, segment, detect: the model's Task ...
    options: TaskOptions | None = None  # ... and the stream's options
    max_work_bytes: int = 0

    def spec_for(self, image: Encoded) -> PostSpec:
        """Frame ``image``'s spec, from its own size and format (the frames of one stream
        may differ); 413 when its answer would hold more than ``max_work_bytes``."""
        if self.spec is not None:
            return self.spec
        assert self.options is not None and self.model_task is not None
        p = image.plan
        mine = for_image(self.options, p.height, p.width, p.kind)
        check_work(self.model_task, mine, self.max_work_bytes)
        return PostSpec(self.task.name, task=self.model_task, options=mine)


def _read_classify(ingress: Any, model: str, query: Mapping[str, str], fmt: str | None) -> PostSpec:
    """``top_k`` as ``POST /v1/models/{m}/classify`` takes it (default ``default_top_k``,
    1 to the model's classes, at most 64)."""
    raw = query.get("top_k")
    try:
        k = ingress.cfg.ingress.default_top_k if raw is None else int(raw)
    except ValueError:
        raise InvalidInput("bad request parameters", top_k=raw[:64]) from None
    labels = ingress.cards[model].labels
    kmax = min(64, len(labels)) if labels else 64
    if not 1 <= k <= kmax:
        raise InvalidInput("top_k out of range", top_k=k, max=kmax)
    return PostSpec("classify", top_k=k)


def _reader(kind: str) -> Callable[[Any, str, Mapping[str, str], str | None], TaskOptions]:
    """The options of task ``kind`` from the stream's query, as its route reads them from
    its own (``parse_options``); an image's ``format`` is the route's ``Accept``."""

    def read(ingress: Any, model: str, query: Mapping[str, str], fmt: str | None) -> TaskOptions:
        own = {k: v for k, v in query.items() if k in PARAMS[kind]}
        accept = IMAGE_FORMATS[fmt] if kind == "image" and fmt is not None else None
        return parse_options(kind, own, accept)

    return read


def _task(name: str, formats: tuple[str, ...], default: str | None) -> StreamTask:
    return StreamTask(name, formats, default, frozenset(PARAMS[name]), _reader(name))


TASKS: dict[str, StreamTask] = {
    "classify": StreamTask("classify", ("json",), "json", frozenset({"top_k"}), _read_classify),
    "image": _task("image", tuple(IMAGE_FORMATS), None),
    "segment": _task("segment", ("png", "json"), "png"),
    "detect": _task("detect", ("json",), "json"),
}


def fields(answer: Answer, timings_ms: dict[str, float]) -> tuple[dict[str, Any], bytes | None]:
    """A frame's answer as its task's route answers: the JSON fields (``top_k``, or the
    task's result -- boxes, class areas -- with ``timings_ms``, ``batch_size`` and
    ``random_weights``), and the encoded image or mask where the answer is one (its
    ``media_type`` among the fields; the route's headers become fields)."""
    facts = {
        "timings_ms": timings_ms,
        "batch_size": answer.batch_size,
        "random_weights": answer.random_weights,
    }
    if answer.media is not None:
        return {"media_type": answer.media_type, **facts}, answer.media
    if answer.result is not None:  # a task's JSON: its result's fields, as its route's
        return {**answer.result, **facts}, None
    return answer.body(timings_ms), None


def _named(model_task: Task, query: Mapping[str, str]) -> StreamTask:
    """The task the query names, else the model's own (classify for a model of tensors)."""
    own = model_task.kind if model_task.kind in TASKS else "classify"
    name = query.get("task") or own
    task = TASKS.get(name)
    if task is None:
        raise InvalidInput("no such task", task=name[:64], tasks=sorted(TASKS))
    unknown = sorted(set(query) - STREAM_PARAMS - task.params)
    if unknown:
        raise InvalidInput(
            "unknown query parameter",
            parameter=unknown[0][:40],
            allowed=sorted(STREAM_PARAMS | task.params),
        )
    return task


async def _model_task(ingress: Any, model: str) -> Task:
    """The model's task as its routes resolve it (``TaskRoutes.task_of``: its outputs, asked
    of the inference stage once); where that ask fails without a Ferry error (a stage being
    replaced), a refusal a retry may pass (1013), not a broken handshake."""
    try:
        return await ingress.task_of(model)
    except FerryError:
        raise
    except Exception as exc:
        err = unwrap(exc)
        if isinstance(err, FerryError):
            raise err from None
        raise Unavailable(
            "the model's task could not be asked of the inference stage",
            model=model,
            cause=type(err).__name__,
            retry_after_s=ingress.cfg.batching.retry_after_s,
        ) from None


async def plan_of(ingress: Any, model: str, query: Mapping[str, str]) -> FramePlan:
    """The stream's task (``task``; the model's own by default, resolved as its routes
    resolve it) and what its frames carry; 400 naming what is wrong (a model of another
    task names its route), 406 for an image format without an encoder."""
    model_task = await _model_task(ingress, model)
    task = _named(model_task, query)
    ingress.check_route(model, task.name)
    fmt = query.get("format") or task.default_format
    if fmt is not None and fmt not in task.formats:
        raise InvalidInput("format not offered by this task", format=fmt[:64], formats=task.formats)
    read = task.read(ingress, model, query, fmt)
    if isinstance(read, PostSpec):
        return FramePlan(task, fmt, spec=read)
    limit = ingress.cfg.ingress.max_image_work_bytes
    return FramePlan(task, fmt, model_task=model_task, options=read, max_work_bytes=limit)


def ask(
    ingress: Any, model: str, image: Encoded, meta: RequestMeta, spec: PostSpec
) -> asyncio.Future:
    """The answer of this image for this spec: one frame into the ingress's coalescer of v1
    images (the frame lane: admitted with its stream, ahead of the requests waiting with
    it). The future's result is the ``Answer`` (or the frame's own error)."""
    coalescer = ingress._coalescer(model, COALESCER)  # (ingress.py: the routes' own)
    return coalescer.submit_frame(ImageRequest(image, spec, meta), meta.request_id)
