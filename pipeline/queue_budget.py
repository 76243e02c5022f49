"""The queue-time budget: overload is refused at once instead of queued.

After Triton's ``dynamic_batching`` queue policy with ``timeout_action: REJECT``: a request
may wait at most ``budget_s`` between its arrival and the start of its batch. Two rules
keep it, wherever requests wait (the ingress's coalescer, the GPU stage's scheduler):

* **admission**: a request whose predicted wait -- the requests ahead of it over the
  measured rate at which that queue drains, or, before any rate is measured, the age of
  the queue's head -- would pass the budget is refused at once (``QueueFull``, HTTP 503
  with ``Retry-After``, ``reason: queue_budget``);
* **dispatch**: a request that has waited past its budget anyway is dropped before it
  costs any work (``reason: queue_timeout``).

Pure logic with the clock passed in; tests drive it with a fake one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import QueueFull

ADMISSION = "queue_budget"  # refused on arrival: the predicted wait passes the budget
DISPATCH = "queue_timeout"  # dropped before its batch: it waited past the budget


@dataclass
class RateMeter:
    """Items a queue hands on per second while it is backlogged -- its capacity: the
    exponentially weighted mean of the items a completion hands on over the weighted mean
    of the time it took (a ratio of means, not a mean of ratios: completions that come
    back together -- groups answered by one downstream batch -- have a time of almost 0,
    and their ``n / dt`` would outweigh every other sample). A completion of ``n`` items
    counts the time since the previous completion or since its own start, whichever is
    later. Only a completion while items still wait is a sample (``busy``): under light
    load completions follow the arrivals and would understate what the queue can drain."""

    alpha: float = 0.3
    rate: float | None = None  # items/s; None until the first completion
    last_done: float = -math.inf
    samples: int = 0
    min_samples: int = 3  # trusted from then on: the first completions after a start or an
    # idle spell come back one at a time and undercount what the pipelined queue drains
    mean_n: float | None = None  # weighted mean items a completion
    mean_dt: float | None = None  # weighted mean seconds a completion

    def done(self, n: int, started: float, now: float, busy: bool = True) -> None:
        dt = now - max(self.last_done, started)
        self.last_done = now
        if n <= 0 or dt < 0 or not busy:
            return
        if self.mean_n is None or self.mean_dt is None:
            self.mean_n, self.mean_dt = float(n), dt
        else:
            self.mean_n += self.alpha * (n - self.mean_n)
            self.mean_dt += self.alpha * (dt - self.mean_dt)
        self.samples += 1
        if self.mean_dt > 0:
            self.rate = self.mean_n / self.mean_dt

    def wait_s(self, ahead: int) -> float | None:
        """Time for ``ahead`` items to drain; None until the rate is measured."""
        if self.rate is None or self.rate <= 0 or self.samples < self.min_samples:
            return None
        return ahead / self.rate


def predicted_wait_s(ahead: int, meter: RateMeter | None, head_age_s: float | None) -> float:
    """How long a request arriving now will wait: ``ahead`` over the drain rate, or the
    age of the queue's head while no rate is known (0 for an empty queue)."""
    w = meter.wait_s(ahead) if meter is not None else None
    if w is not None:
        return w
    return max(0.0, head_age_s or 0.0) if ahead else 0.0


def admit(
    waited_s: float,
    ahead: int,
    meter: RateMeter | None,
    head_age_s: float | None,
    budget_s: float | None,
    retry_after_s: float,
    request_id: str = "",
    queue: str = "",
) -> None:
    """Raise ``QueueFull`` (reason ``queue_budget``) when a request that has already waited
    ``waited_s`` would wait past ``budget_s`` in this queue (named ``queue`` in the error);
    nothing when it fits."""
    if budget_s is None:
        return
    wait = predicted_wait_s(ahead, meter, head_age_s)
    if waited_s + wait > budget_s:
        raise QueueFull(
            "overloaded: the predicted queue wait passes the model's queue budget",
            reason=ADMISSION,
            queue=queue,
            predicted_wait_ms=round((waited_s + wait) * 1e3, 1),
            budget_ms=round(budget_s * 1e3, 1),
            queue_ahead=ahead,
            retry_after_s=retry_after_s,
            request_id=request_id,
        )


def timed_out(
    waited_s: float, budget_s: float, retry_after_s: float, request_id: str = "", queue: str = ""
) -> QueueFull:
    """The error of a request dropped at dispatch (reason ``queue_timeout``)."""
    return QueueFull(
        "overloaded: the request waited past the model's queue budget",
        reason=DISPATCH,
        queue=queue,
        waited_ms=round(waited_s * 1e3, 1),
        budget_ms=round(budget_s * 1e3, 1),
        retry_after_s=retry_after_s,
        request_id=request_id,
    )
