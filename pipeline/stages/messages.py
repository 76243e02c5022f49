"""What travels between the stages: one message per downstream call, carrying many requests.

A call carries the requests the ingress coalesced; each request owns one or more rows
(a classify request one image, a v2 infer request a whole tensor). Requests that failed
on the way are carried as errors, so one bad image never fails its neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.errors import FerryError
from pipeline.imaging import DecodePlan, Target, plan_decode


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
    """Images (after preprocessing) or logits (after inference) of one call."""

    n_requests: int
    data: np.ndarray | None  # [rows, ...]; None when every request failed
    owner: list[int]  # request index of each row
    errors: dict[int, FerryError] = field(default_factory=dict)
    timings_ms: dict[str, float] = field(default_factory=dict)  # per call
    row_timings_ms: dict[str, list[float]] = field(
        default_factory=dict
    )  # per row (queue, gpu, batch)
    random_weights: bool = False
    envelope: Any = None  # GPU preprocessing: the batch is on its way over a transport
    more: tuple[np.ndarray, ...] = ()  # a model's outputs after the first, row for row

    def rows_by_request(self) -> dict[int, list[int]]:
        """Each request's row indices, in one pass over ``owner``."""
        rows: dict[int, list[int]] = {}
        for i, o in enumerate(self.owner):
            rows.setdefault(o, []).append(i)
        return rows


@dataclass(frozen=True)
class RequestMeta:
    """What the inference stage needs to know of each request."""

    request_id: str
    deadline: float | None = None  # epoch seconds
    priority: bool = False


@dataclass(frozen=True)
class PostSpec:
    """What the client asked to get back."""

    kind: str  # "classify" or "v2"
    top_k: int = 5
    outputs: tuple[str, ...] = ("probabilities",)  # requested (v2)
    names: tuple[str, ...] = ("logits",)  # the model's own outputs, in order (v2)
