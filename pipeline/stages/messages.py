"""What travels between the stages: one message per downstream call, carrying many requests.

A call carries the requests the ingress coalesced; each request owns one or more rows
(a classify request one image, a v2 infer request a whole tensor). Requests that failed
on the way are carried as errors, so one bad image never fails its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from pipeline.errors import FerryError
from pipeline.imaging import DecodePlan, Target, plan_decode

if TYPE_CHECKING:
    from pipeline.tasks.options import TaskOptions
    from pipeline.tasks.spec import Task
    from pipeline.transport.base import Envelope


@dataclass(frozen=True)
class Encoded:
    """One image as the ingress checked it: its bytes, its declared media type, and the plan
    made from its header (format, size, DCT scale, resize window, working set), so the stage
    that decodes it sniffs and parses nothing again."""

    data: bytes
    content_type: str | None
    plan: DecodePlan

    @classmethod
    def checked(
        cls,
        data: bytes,
        content_type: str | None,
        target: Target,
        max_pixels: int,
        max_work_bytes: int,
    ) -> Encoded:
        """Check and plan ``data`` from its header (400/413/415 with the reason)."""
        return cls(
            data, content_type, plan_decode(data, content_type, target, max_pixels, max_work_bytes)
        )


@dataclass
class Rows:
    """What the rows of one call carry, wherever they are: ``HostRows`` (numpy, host
    memory), ``DeviceRows`` (views of a batch in an executor's pool) and ``Logits`` (the
    model's outputs) add the data."""

    n_requests: int
    owner: list[int]  # request index of each row
    errors: dict[int, FerryError] = field(default_factory=dict)  # requests that failed
    preprocess_ms: float | None = None  # the call's decoding; None: it was not decoded

    def rows_by_request(self) -> dict[int, list[int]]:
        """Each request's row indices, in one pass over ``owner``."""
        rows: dict[int, list[int]] = {}
        for i, o in enumerate(self.owner):
            rows.setdefault(o, []).append(i)
        return rows


@dataclass
class HostRows(Rows):
    """Rows in host memory: images decoded on CPU threads, or a v2 request's tensors."""

    data: np.ndarray | None = None  # [rows, ...]; None when every request failed


@dataclass
class DeviceRows(Rows):
    """Rows on the device, made by GPU preprocessing: ``data[i]`` is row ``i``, a view of a
    batch complete on the device -- from the executor's pool (cupy on a GPU; numpy arrays
    of the pool where the backend is numpy), or the batch received from PreprocessGPU.
    Sent to another process, ``data`` is None and ``envelope`` stands for the batch on its
    way over a transport (``received`` makes the rows of what came)."""

    data: Sequence[Any] | None = None  # device arrays, row for row; None: no row (all failed)
    envelope: Envelope | None = None

    def received(self, batch: Any) -> HostRows | DeviceRows:
        """The rows of the batch this envelope stood for: on the device, or host rows
        where the receiver is on the host (the object store to a numpy executor)."""
        if isinstance(batch, np.ndarray):
            return HostRows(self.n_requests, self.owner, self.errors, self.preprocess_ms, batch)
        return DeviceRows(self.n_requests, self.owner, self.errors, self.preprocess_ms, batch)


@dataclass(frozen=True)
class SendTo:
    """Where PreprocessGPU sends a call's batch: the inference replica's receiving end --
    its transport (``nccl`` or ``object_store``) and, for NCCL, its endpoint and its GPU
    (two replicas on one GPU cannot link: the batch goes by the object store)."""

    transport: str
    endpoint: str | None = None
    gpu: str | None = None


@dataclass
class RowTimes:
    """Each logit row's own times: how long it queued for the GPU and its batch ran (ms),
    and the size of that batch."""

    queue: list[float] = field(default_factory=list)
    gpu: list[float] = field(default_factory=list)
    batch_size: list[int] = field(default_factory=list)


@dataclass
class Logits(HostRows):
    """The model's outputs of one call: its first output in ``data``, the others in
    ``more``, row for row (or its task's epilogue's: ``finite``)."""

    more: tuple[np.ndarray, ...] = ()
    row_times: RowTimes = field(default_factory=RowTimes)
    random_weights: bool = False
    # where a task's epilogue ran on the device (``engines/epilogue.py``): ``data`` is its
    # answer's bytes (pixels, a mask) and this each row's finiteness (uint8 [N], 0: NaN/inf)
    finite: np.ndarray | None = None


@dataclass
class Hop:
    """The Serve call that reached the replica that answered, in wall-clock ms (the ingress
    and that replica share no other clock): ``arrived`` and ``left`` stamped by the replica
    (``deployments/replica.py``), ``sent`` by the ingress."""

    arrived: float
    left: float
    sent: float | None = None


@dataclass
class Timings:
    """Where one request's time went, as its answer brings it back: each stage's ms (None:
    it did not pass that stage) and the stamps from which the ingress splits the rest."""

    preprocess: float | None = None
    queue: float | None = None  # waiting for the GPU (the slowest of its rows)
    gpu: float | None = None  # its GPU batch running (the slowest of its rows)
    postprocess: float | None = None
    left_coalescer: float | None = None  # ingress perf_counter ms: its group left
    hop: Hop | None = None  # only where a Serve call reached the replica that answered

    def report(
        self, arrived: float, queued: float, now: float, now_wall: float
    ) -> dict[str, float]:
        """The answer's ``timings_ms``, rounded to the microsecond: the stages it passed;
        ``ingress``, from its arrival (``arrived``, perf_counter ms) to its group leaving
        the coalescer, and of that ``coalesce``, the wait in the coalescer's queue (from
        ``queued``: the queue the budget bounds there); of a stamped hop, ``hop_in`` (the
        call's way there) and ``hop_out`` (its way back, to ``now_wall``); ``hops``, what
        no stage accounts for; ``total`` (to ``now``, perf_counter ms)."""
        total = now - arrived
        left = arrived if self.left_coalescer is None else self.left_coalescer
        t: dict[str, float] = {}
        spent = left - arrived  # the ingress's and every stage's: what hops leaves out
        for k, v in (
            ("preprocess", self.preprocess),
            ("queue", self.queue),
            ("gpu", self.gpu),
            ("postprocess", self.postprocess),
        ):  # (STAGES, spelled out: a getattr a stage cost a request a microsecond)
            if v is not None:
                t[k] = round(v, 3)
                spent += v
        t["ingress"] = round(left - arrived, 3)
        t["coalesce"] = round(max(0.0, left - queued), 3)
        hop = self.hop
        if hop is not None and hop.sent is not None:
            t["hop_in"] = round(max(0.0, hop.arrived - hop.sent), 3)
            t["hop_out"] = round(max(0.0, now_wall - hop.left), 3)
        t["hops"] = round(max(0.0, total - spent), 3)
        t["total"] = round(total, 3)
        return t


STAGES = ("preprocess", "queue", "gpu", "postprocess")  # Timings' own, in report order


@dataclass
class Answer:
    """One request's answer from the stage that answers: its top-k (classify), its output
    tensors by name (v2), or its task's answer -- encoded bytes (``media``: an image, a
    mask) or JSON (``result``: boxes, class areas) -- and what it cost."""

    timings: Timings
    batch_size: int = 0  # the largest GPU batch its rows rode in
    random_weights: bool = False
    top_k: list[dict[str, Any]] | None = None
    outputs: dict[str, np.ndarray] | None = None
    media: bytes | None = None
    media_type: str | None = None
    result: dict[str, Any] | None = None

    def body(self, timings_ms: dict[str, float]) -> dict[str, Any]:
        """The answer as the ingress sends it on (``timings_ms``: ``Timings.report``);
        ``media``, where there is one, rides beside the JSON keys."""
        if self.outputs is not None:
            head: dict[str, Any] = {"outputs": self.outputs}
        elif self.top_k is not None or (self.result is None and self.media is None):
            head = {"top_k": self.top_k}
        else:
            head = {"result": self.result, "media": self.media, "media_type": self.media_type}
        return {
            **head,
            "timings_ms": timings_ms,
            "batch_size": self.batch_size,
            "random_weights": self.random_weights,
        }


@dataclass(frozen=True)
class RequestMeta:
    """What the inference stage needs to know of each request."""

    request_id: str
    deadline: float | None = None  # epoch seconds
    priority: bool = False
    queued: float | None = None  # epoch seconds: it joined the ingress's queue (the budget's start)
    frame: bool = False  # a frame of an admitted live stream: its deadline, not the budget, rules


@dataclass(frozen=True)
class ImageRequest:
    """One image as the ingress coalesces it (a classify request, or one image of a v2
    request of encoded images): its checked bytes, who asks and what it asks back."""

    image: Encoded
    spec: PostSpec
    meta: RequestMeta


@dataclass(frozen=True)
class TensorRequest:
    """A v2 request of tensors as the ingress coalesces it: its rows, who asks, what back."""

    tensors: np.ndarray  # [rows, ...], the model's input
    meta: RequestMeta
    spec: PostSpec


@dataclass(frozen=True)
class PostSpec:
    """What the client asked to get back."""

    kind: str  # "classify", "v2", or a task's route: "image", "segment", "detect"
    top_k: int = 5
    outputs: tuple[str, ...] = ("probabilities",)  # requested (v2)
    names: tuple[str, ...] = ("logits",)  # the model's own outputs, in order (v2)
    task: Task | None = None  # image, segment, detect: the model's task (one object a model)
    options: TaskOptions | None = None  # ... and what this request asked of it
