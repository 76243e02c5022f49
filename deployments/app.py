"""Build the Ferry application from one pydantic config: the composition root.

The only reader of the placement's row (``pipeline.config.placements``): ``bindings`` turns
it into the Serve deployments to bind, each told what it is given -- the ingress its way
downstream, the inference replica whether it decodes and answers and whom it fetches from.

    serve run serve_config.yaml                       # the embedded CPU default
    serve run deployments.app:build_app               # the same defaults, no file
    serve run deployments.app:build_app config=path/to/pipeline.yaml

``build_app(args)`` takes the ``args`` of a Serve config file: either the pipeline config
inline under ``config:``, or a path to a YAML/JSON file of it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.serve.exceptions import RayServeException

from pipeline.check import check
from pipeline.config import PipelineConfig, Placement
from pipeline.placement import Cluster

from .config_file import load_config
from .inference import Inference
from .ingress import Ingress
from .postprocess import Postprocess
from .preprocess import Preprocess
from .preprocess_gpu import PreprocessGPU


@dataclass(frozen=True)
class Binding:
    """One deployment of a placement: its stage (whose ``<stage>_deployment`` options it
    takes), its Serve deployment, what it is given (choices, by name) and the stages whose
    handles it is given."""

    stage: str
    deployment: Any
    given: dict[str, Any]
    handles: tuple[str, ...] = ()


def bindings(row: Placement) -> list[Binding]:
    """The deployments of a placement's row, callees first. This is the one place a row is
    turned into code: each stage is told what it gets (a decoder, an answerer, the way
    downstream, a PreprocessGPU to fetch from) and never asks which placement it is in."""
    out = []
    if row.decode_in == "preprocess":
        out.append(Binding("preprocess", Preprocess, {}))
    elif row.decode_in == "preprocess_gpu":
        out.append(Binding("preprocess", PreprocessGPU, {}))
    if "inference" in row.deployments:
        given = {
            "decode_here": row.decode_in == "executor",
            "answer_here": row.answer_in == "executor",
        }
        fetch = ("preprocess",) if row.decode_in == "preprocess_gpu" else ()
        out.append(Binding("inference", Inference, given, fetch))
    if row.answer_in == "postprocess":
        out.append(Binding("postprocess", Postprocess, {}))
    called = {"chain": ("preprocess", "inference", "postprocess"), "hop": ("inference",)}
    out.append(Binding("ingress", Ingress, {"way": row.way_down}, called.get(row.way_down, ())))
    return out


logger = logging.getLogger(__name__)


class ConfigRefused(RayServeException):
    """A pipeline config that cannot be deployed, in one line. Serve's build task reports a
    builder's ``RayServeException`` as its text alone (``build_serve_application``), any
    other error as its whole traceback -- where pydantic's reason came last of 40 lines."""


def one_line(exc: BaseException) -> str:
    """An error as one line: pydantic's as ``loc: message; ...``, others' text folded."""
    errs = getattr(exc, "errors", None)
    if callable(errs):
        try:
            return "; ".join(
                ".".join(str(p) for p in e.get("loc", ())) + ": " + str(e.get("msg", ""))
                for e in errs()
            )
        except Exception:
            pass
    return " ".join(str(exc).split())


def build(config: PipelineConfig) -> serve.Application:
    raw = config.model_dump(mode="json")
    log = config.serve_logging_config()  # None: Serve's own logging_config applies

    def opts(d) -> dict:
        return d.serve_options() if log is None else {**d.serve_options(), "logging_config": log}

    bound: dict[str, Any] = {}
    for b in bindings(config.placement_row):
        d = getattr(config, f"{b.stage}_deployment")
        handles = {h: bound[h] for h in b.handles}
        bound[b.stage] = b.deployment.options(**opts(d)).bind(raw, **b.given, **handles)
    return bound["ingress"]


def place(config: PipelineConfig) -> PipelineConfig:
    """The config checked and resolved for the cluster (``pipeline.check``). Serve builds a
    config file's application inside the cluster, so Ray is up here; an import path given to
    ``serve run`` is built before Ray starts, and then only an explicit ``gpus`` resolves."""
    return check(config, Cluster.from_ray(ray.nodes()) if ray.is_initialized() else None)


def build_app(args: dict[str, Any] | None = None) -> serve.Application:
    """The Serve application builder (``import_path: deployments.app:build_app``); a config
    that cannot be deployed fails the deploy (``DEPLOY_FAILED``) with ``ConfigRefused``."""
    try:
        config = place(load_config(args))
    except (OSError, ValueError) as exc:  # (pydantic's ValidationError is a ValueError)
        raise ConfigRefused(f"Ferry's pipeline config: {one_line(exc)}") from None
    logger.info(
        "building Ferry: models %s on %s", [m.name for m in config.models], config.executor.backend
    )
    return build(config)


if os.environ.get("FERRY_DEFAULT_APP"):  # `serve run deployments.app:app`
    app = build_app()
