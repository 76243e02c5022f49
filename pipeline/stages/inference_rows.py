"""The rows of a call through the GPU: each row's result of its batch (``RowOut``), the
rows gathered back into a call's order with their owners and times (``collect``), stacked
into the call's outputs (``stack``), and the parts of a batch run in pieces joined
(``concat``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.errors import FerryError

from .messages import RequestMeta, RowTimes


@dataclass(frozen=True)
class RowOut:
    """One row's result of a GPU batch: the model's output row (a tuple of them for a model
    of several outputs), how long the row queued and the batch ran (ms), the batch's size."""

    row: Any
    queue_ms: float
    gpu_ms: float
    batch_size: int


def concat(parts: list[Any]) -> Any:
    """The outputs of a batch run in parts (a model whose max_batch is below the batch's)."""
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate(c) for c in zip(*parts, strict=True))
    return np.concatenate(parts)


def collect(
    futs: list[Any], results: list[Any], owners: list[int], errors: dict[int, FerryError]
) -> tuple[list[Any], list[int], RowTimes]:
    """The rows that came back (``RowOut``s, in row order) with their owners and times; a
    row that failed puts its request's error in ``errors``."""
    it = iter(results)
    rows, owner, times = [], [], RowTimes()
    for i, f in enumerate(futs):
        if f is None:
            continue
        r = next(it)
        o = owners[i]
        if isinstance(r, BaseException):
            errors.setdefault(
                o, r if isinstance(r, FerryError) else FerryError(f"{type(r).__name__}: {r}")
            )
            continue
        if o in errors:
            continue
        rows.append(r.row)
        owner.append(o)
        times.queue.append(r.queue_ms)
        times.gpu.append(r.gpu_ms)
        times.batch_size.append(r.batch_size)
    return rows, owner, times


def stack(rows: list[Any]) -> tuple[np.ndarray | None, tuple[np.ndarray, ...]]:
    """The kept rows as (the first output, fp32 [N, ...] -- an epilogue's bytes as they
    are -- the model's other outputs)."""
    if not rows:
        return None, ()
    cols = list(zip(*rows, strict=True)) if isinstance(rows[0], tuple) else [rows]
    first = np.stack(cols[0])
    first = first if first.dtype == np.uint8 else first.astype(np.float32)
    return first, tuple(np.stack(c) for c in cols[1:])


def waited_s(meta: RequestMeta, now_epoch: float, decoding_s: float) -> float:
    """How long a request has waited before the GPU queue: the time since it joined the
    ingress's queue (``meta.queued``, epoch seconds) that was not its call's decoding --
    the coalescer's queue, Serve's queues and the hops between (0 where it was not stamped).
    Across nodes the two wall clocks are as close as their time sync keeps them."""
    if meta.queued is None:
        return 0.0
    return max(0.0, now_epoch - meta.queued - decoding_s)
