"""The executor's modes, one class each, chosen once at start-up (``make_mode``):

* ``real`` -- ``GraphMode``: the staged path (``executor_commit``), each arena's first
  eager run on the GPU recorded as a CUDA graph and replayed by every later batch on it;
* ``eager`` -- ``EagerMode``: the same path launching kernel by kernel (the graphs' baseline);
* ``naive`` -- ``NaiveMode`` (``executor_naive``): allocate, copy, compute, copy, free per call.

Every mode has the same surface: ``prepare`` / ``commit`` / ``fit`` (size the staging for
the models) / ``forget`` (a model unloaded) / ``close``, its ``ring`` (None for naive),
``bound_graphs``, and the warm-up's ``warm_depth`` and ``warm_rounds``.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from .async_result import AsyncResult
from .config import ExecutorConfig
from .engines.base import EnginePlan
from .executor_batch import PreparedBatch
from .executor_commit import ModeParts, StagedMode
from .executor_graphs import BoundGraphs
from .executor_naive import NaiveMode
from .memory import PinnedRing

__all__ = ["EagerMode", "GraphMode", "Mode", "NaiveMode", "make_mode"]


class Mode(Protocol):
    name: str
    ring: PinnedRing | None
    bound_graphs: BoundGraphs
    warm_depth: int
    warm_rounds: int
    warm_runs_all: bool

    def fit(self, slot_bytes: int) -> None: ...

    def prepare(
        self, model: str, n: int, bucket: int, plan: EnginePlan, timeout: float | None
    ) -> PreparedBatch: ...

    def commit(
        self, p: PreparedBatch, x: np.ndarray | list[np.ndarray], label: str
    ) -> AsyncResult: ...

    def settle(self, model: str) -> None: ...

    def forget(self, model: str) -> None: ...

    def close(self) -> None: ...


class GraphMode(StagedMode):
    name = "real"
    capture = True


class EagerMode(StagedMode):
    name = "eager"
    capture = False


def make_mode(config: ExecutorConfig, parts: ModeParts) -> Mode:
    """The mode ``config.mode`` names, given what it uses."""
    if config.mode == "naive":
        return NaiveMode(parts.backend, parts.models, parts.counters)
    cls = GraphMode if config.mode == "real" else EagerMode
    return cls(config, parts)
