"""The one check of a pipeline config against what its validation cannot see -- the engines,
the files and the cluster -- run by the application's build, ``ferry config check`` and the
tests.

    config = check(PipelineConfig.model_validate(raw), Cluster.from_ray(ray.nodes()))
    config = check(config, Cluster(gpus=4), load=True, tell=print)  # config check --gpus 4

``PipelineConfig`` validates shapes and values only (``pipeline/config`` imports nothing of
Ferry's). ``check`` then, in this order:

1. every model entry: its engine is one of ``pipeline.engines.ENGINES``; its source, weights
   and labels files exist and can be read; its labels file has labels (``entry_problems``);
2. ``replicas_per_gpu`` turned into replica counts and GPU shares against the cluster's GPUs
   (``placement.resolve``; ``cluster=None``: unknown, so only an explicit ``gpus`` resolves);
3. the resolved layout against the cluster's live nodes where they are known
   (``placement.check_fits``); what cannot be checked there (no GPU node up yet) is a note;
4. with ``load``, the models loaded as the inference replica loads them (``check_models``:
   the engine built and checked, every bucket planned), a note saying they load.

It returns the resolved config. The first step that finds a problem raises
``ConfigCheckFailed`` (a ``ValueError``) naming every problem that step found;
``ModelsDoNotLoad`` is step 4's. Notes go to ``tell`` (the log's warnings unless given).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from pydantic import ValidationError

from . import placement
from .config import ExecutorConfig, ModelConfig, PipelineConfig
from .device import cuda_available
from .engines import ENGINES
from .errors import DeviceError
from .executor import GpuExecutor
from .models.loading import LoadReport, load_models
from .models.repository import read_labels
from .placement import Cluster

logger = logging.getLogger(__name__)
LOAD_HOW = "as the inference replica loads them: engine built, every bucket planned"


class ConfigCheckFailed(ValueError):
    """A config that validates but that its engines, its files or the cluster refuse; its
    text names each problem (``; `` between them)."""


class ModelsDoNotLoad(ConfigCheckFailed):
    """Models of a valid config that its inference replica would refuse; one line a model."""


def check(
    config: PipelineConfig,
    cluster: Cluster | None = None,
    *,
    load: bool = False,
    tell: Callable[[str], None] | None = None,
) -> PipelineConfig:
    """``config`` checked against its engines, files and ``cluster`` (``None``: unknown) and
    resolved for it; with ``load``, its models loaded as the inference replica loads them."""
    say = tell or _warn
    problems = [p for entry in config.models for p in entry_problems(entry)]
    if problems:
        raise ConfigCheckFailed("; ".join(problems))
    known = cluster or Cluster()
    try:
        config = placement.resolve(config, known.gpus)
        notes = placement.check_fits(config, list(known.nodes)) if known.nodes else []
    except ValidationError:
        raise  # pydantic's own, with its fields
    except ValueError as exc:  # placement's: one line naming the values
        raise ConfigCheckFailed(str(exc)) from None
    for note in notes:
        say(note)
    if load:
        say(_loads(config))
    return config


def entry_problems(entry: ModelConfig) -> list[str]:
    """What of a model entry its engines and files refuse, one line each (none: fine)."""
    out = []
    if entry.engine not in ENGINES:
        out.append(
            f"model {entry.name!r}: unknown engine {entry.engine!r}; known: {sorted(ENGINES)}"
        )
    for what, path in entry.files().items():
        if not os.path.isfile(path):
            out.append(f"model {entry.name!r}: {what} file not found: {path}")
        elif not os.access(path, os.R_OK):
            out.append(f"model {entry.name!r}: {what} file cannot be read: {path}")
        elif what == "labels":
            try:
                read_labels(path)
            except ValueError as exc:  # no labels, or not text: names the file
                out.append(f"model {entry.name!r}: {exc}")
    return out


def check_models(config: PipelineConfig, warm: bool = False) -> tuple[LoadReport, str]:
    """The replica's load check outside a replica: an executor of the config's (on the
    device when one is visible, numpy otherwise; no injected faults) and ``load_models``,
    every bucket planned and -- unless ``warm`` -- not run. The report and the backend."""
    base = config.executor.model_dump()
    base["faults"] = {}
    if not cuda_available():
        base["backend"] = "numpy"
    try:
        executor = GpuExecutor(ExecutorConfig.model_validate(base))
    except DeviceError:  # e.g. a device ordinal this machine has not got
        executor = GpuExecutor(ExecutorConfig.model_validate({**base, "backend": "numpy"}))
    try:
        return load_models(executor, config, warm=warm), executor.backend.name
    finally:
        executor.close()


def _loads(config: PipelineConfig) -> str:
    """Step 4: the note that the models load, or ``ModelsDoNotLoad`` naming each refused."""
    report, backend = check_models(config)
    how = f"on {backend}, {LOAD_HOW}"
    if report.refused:
        raise ModelsDoNotLoad(
            f"models that do not load ({how}):\n" + "\n".join(f"  {p}" for p in report.problems())
        )
    return f"models load ({how}): {', '.join(report.loaded)}"


def _warn(note: str) -> None:
    logger.warning("%s", note)
