"""What a local round of the GPU preprocess stage hands around: the JPEGs it decodes, the
answer that sends an image back to the CPU, and rows whose device work may still run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from ..async_result import device_error
from ..batch_scheduler import answered_error

RETRY = object()  # a round's answer for a JPEG the GPU decoder refused: decode it on the CPU


def waited(round_: Callable[..., tuple], *args: Any) -> tuple[list, float, float, Any]:
    """``round_(*args)`` (``(answers, done, cpu_ms, call_ms)``, ``done`` a lane's ``Done``),
    then the round's end on the device waited for in this thread -- a sleeping wait, as
    the lane's watcher would -- with ``done`` replaced by the ms that wait took. A CUDA
    error surfaces here and fails the round."""
    answers, done, cpu_ms, call_ms = round_(*args)
    t0 = time.perf_counter()
    try:
        done.event.synchronize()
    except BaseException as exc:
        raise device_error(exc) from None
    return answers, (time.perf_counter() - t0) * 1e3, cpu_ms, call_ms


class Jpeg:
    """A JPEG for the GPU decoder: its bytes and what it decodes to (h x w x channels)."""

    __slots__ = ("data", "nbytes")

    def __init__(self, data: bytes, nbytes: int) -> None:
        self.data = data
        self.nbytes = nbytes


def split_jpegs(items: list[Any], channels: int) -> tuple[list[tuple[int, Jpeg]], list[int]]:
    """The JPEGs of ``items`` (checked ``Encoded`` images, each with the plan the ingress made
    from its header) for the GPU decoder, by index, each with its decoded size at
    ``channels``; and the indices of everything else, for the CPU path."""
    jpegs: list[tuple[int, Jpeg]] = []
    others: list[int] = []
    for i, it in enumerate(items):
        if it.plan.kind == "jpeg":
            jpegs.append((i, Jpeg(it.data, it.plan.height * it.plan.width * channels)))
        else:
            others.append(i)
    return jpegs, others


class Landing:
    """A round's device row whose GPU work may still run (``preprocess.overlap_rounds``):
    ``done`` is the round's completion, shared by its rows."""

    __slots__ = ("done", "row")

    def __init__(self, row: Any, done: asyncio.Future) -> None:
        self.row = row
        self.done = done


async def landed(results: list[Any]) -> list[Any]:
    """``results`` with each ``Landing`` replaced by its row once its round is complete
    on the device, or by the error that round's wait ended in."""
    rounds = {id(r.done): r.done for r in results if isinstance(r, Landing)}
    if not rounds:
        return results
    await asyncio.wait(list(rounds.values()))
    failed: dict[int, BaseException] = {}
    for k, f in rounds.items():
        exc = asyncio.CancelledError() if f.cancelled() else f.exception()
        if exc is not None:  # as the scheduler answers a failed batch
            failed[k] = answered_error(exc, "a preprocessing round on the device")
    return [(failed.get(id(r.done), r.row) if isinstance(r, Landing) else r) for r in results]
