"""Build the Ferry application from one pydantic config.

    serve run serve_config.yaml                       # the embedded CPU default
    serve run deployments.app:build_app               # the same defaults, no file
    serve run deployments.app:build_app config=path/to/pipeline.yaml

``build_app(args)`` takes the ``args`` of a Serve config file: either the pipeline config
inline under ``config:``, or a path to a YAML/JSON file of it.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import ray
from ray import serve
from ray.serve.exceptions import RayServeException

from pipeline.check import check
from pipeline.config import PipelineConfig
from pipeline.placement import Cluster

from .inference import Inference
from .ingress import Ingress
from .postprocess import Postprocess
from .preprocess import Preprocess
from .preprocess_gpu import PreprocessGPU

# placement -> the deployments it binds, callees first: (stage, deployment, the stages whose
# handles it is given). Each deployment's Serve options are the config's ``<stage>_deployment``.
BINDINGS: dict[str, tuple[tuple[str, Any, tuple[str, ...]], ...]] = {
    "four_stage": (
        ("preprocess", Preprocess, ()),
        ("inference", Inference, ()),
        ("postprocess", Postprocess, ()),
        ("ingress", Ingress, ("preprocess", "inference", "postprocess")),
    ),
    "one_process": (("ingress", Ingress, ()),),
    "split": (("inference", Inference, ()), ("ingress", Ingress, ("inference",))),
    "gpu_preprocess": (
        ("preprocess", PreprocessGPU, ()),
        ("inference", Inference, ("preprocess",)),
        ("ingress", Ingress, ("inference",)),
    ),
}

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


def load_config(args: dict[str, Any] | None) -> PipelineConfig:
    args = dict(args or {})
    cfg = args.pop("config", None)
    if isinstance(cfg, str):
        with open(cfg) as f:
            text = f.read()
        if cfg.endswith((".yaml", ".yml")):
            import yaml

            cfg = yaml.safe_load(text)
        else:
            cfg = json.loads(text)
    if cfg is None:
        cfg = args  # the fields given directly as args
    elif args:
        raise ValueError(
            f"give the pipeline config under 'config' or as args, not both: {sorted(args)}"
        )
    return PipelineConfig.model_validate(cfg or {})


def build(config: PipelineConfig) -> serve.Application:
    raw = config.model_dump(mode="json")
    log = config.serve_logging_config()  # None: Serve's own logging_config applies

    def opts(d) -> dict:
        return d.serve_options() if log is None else {**d.serve_options(), "logging_config": log}

    bound: dict[str, Any] = {}
    for stage, deployment, given in BINDINGS[config.placement]:
        d = getattr(config, f"{stage}_deployment")
        bound[stage] = deployment.options(**opts(d)).bind(raw, **{h: bound[h] for h in given})
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
