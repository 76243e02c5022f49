"""The stage protocol: what every stage core offers, whatever process it runs in.

A stage is built from the validated ``PipelineConfig`` in the process it runs in (a Serve
replica, the ingress replica in ``one_process``, a test, a benchmark). ``run(model, ...)``
does its work on one coalesced call -- many requests, one message -- and returns the next
message (or, in the stage that answers, one answer or error per request); a request that
fails is carried as its error, never failing its neighbours. ``check_health`` raises when
the stage cannot serve. ``deployments/replica.py`` makes a Serve deployment of any stage.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stage(Protocol):
    """One stage of the pipeline: decode, inference, postprocess, GPU preprocess."""

    def run(self, model: str, *args: Any, **kwargs: Any) -> Any:
        """The stage's work on one call (a value, or an awaitable of it)."""
        ...

    def check_health(self) -> None:
        """Raise when this stage cannot serve (Serve replaces the replica)."""
        ...
