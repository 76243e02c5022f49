"""What a stream's frames ask of the ingress, task by task: the one place where a task's
request and answer plug into the stream route (``streams_route.py``), which knows no task.

A ``StreamTask`` is what its own HTTP route does with one image, cut in three: ``spec``, its
``PostSpec`` from the stream's query (checked once, at the handshake, as the route checks its
parameters); ``coalescer``, which of the ingress's coalescers its images ride (with the
route's own requests, in the same groups and GPU batches); ``fields``, the result fields of
its ``Answer`` as the route answers them. ``ask`` hands one frame to the ingress and gives
back the future of its answer.

Today's task is ``classify``. ``image``, ``segment`` and ``detect`` (issue 33) are refused
by name until their routes land; each will be one more entry of ``TASKS``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.errors import InvalidInput
from pipeline.stages.messages import Answer, Encoded, ImageRequest, PostSpec, RequestMeta

COMING = ("image", "segment", "detect")  # named by issue 33, not served yet


@dataclass(frozen=True)
class StreamTask:
    name: str
    formats: tuple[str, ...]  # the answer formats it offers; the first is the default
    spec: Callable[[Any, str, Mapping[str, str]], PostSpec]  # (ingress, model, query)
    coalescer: str  # the ingress's coalescer its images ride (``Ingress._coalescer``'s kind)
    fields: Callable[[Answer, dict[str, float]], dict[str, Any]]  # (answer, timings_ms)


def _classify_spec(ingress: Any, model: str, query: Mapping[str, str]) -> PostSpec:
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


def _classify_fields(answer: Answer, timings_ms: dict[str, float]) -> dict[str, Any]:
    """As the classify route answers: ``top_k``, ``timings_ms``, ``batch_size``,
    ``random_weights``."""
    return answer.body(timings_ms)


TASKS: dict[str, StreamTask] = {
    "classify": StreamTask("classify", ("json",), _classify_spec, "classify", _classify_fields),
}


def task_of(ingress: Any, model: str, query: Mapping[str, str]) -> tuple[StreamTask, PostSpec]:
    """The stream's task (``task``; the model's own -- ``classify`` for every model today --
    by default) and the ``PostSpec`` its frames carry; 400 naming what is wrong."""
    name = query.get("task") or "classify"
    task = TASKS.get(name)
    if task is None:
        if name in COMING:
            raise InvalidInput(
                f"task {name!r} is not served on streams yet", task=name, tasks=sorted(TASKS)
            )
        raise InvalidInput("no such task", task=name[:64], tasks=sorted(TASKS))
    fmt = query.get("format") or task.formats[0]
    if fmt not in task.formats:
        raise InvalidInput("format not offered by this task", format=fmt[:64], formats=task.formats)
    return task, task.spec(ingress, model, query)


def ask(
    ingress: Any, model: str, task: StreamTask, image: Encoded, meta: RequestMeta, spec: PostSpec
) -> asyncio.Future:
    """The answer of this image for this task: one frame into the ingress's coalescer of the
    task's images (the frame lane: admitted with its stream, ahead of the requests waiting
    with it). The future's result is the ``Answer`` (or the frame's own error)."""
    coalescer = ingress._coalescer(model, task.coalescer)  # (ingress.py: the route's own)
    return coalescer.submit_frame(ImageRequest(image, spec, meta), meta.request_id)
