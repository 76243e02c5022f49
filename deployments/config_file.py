"""Reading Ferry's config files: a Serve config (``serve run`` / ``serve deploy``) whose
applications import ``FERRY_APP``, or a bare pipeline config (the fields of
``PipelineConfig``), YAML or JSON -- for the application's build, ``ferry config check``
and ``ferry models``.

    raw = read("serve_config.yaml")
    for app in raw["applications"]:
        args = app_args(app.get("args"), base_dir_of("serve_config.yaml"))
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

from pipeline.config import PipelineConfig

FERRY_APP = "deployments.app:build_app"


def read(path: str) -> Any:
    """A config file's content: JSON for ``.json``, YAML (JSON's superset) otherwise."""
    with open(path) as f:
        text = f.read()
    return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)


def base_dir_of(path: str) -> str:
    """The directory a config file's relative paths are relative to (``serve run``'s)."""
    return os.path.dirname(os.path.abspath(path))


def app_args(args: dict[str, Any] | None, base_dir: str) -> dict[str, Any]:
    """An application's ``args`` with a relative ``config`` path made relative to
    ``base_dir``, as ``serve run`` reads it from the file's directory."""
    out = dict(args or {})
    cfg = out.get("config")
    if isinstance(cfg, str) and not os.path.isabs(cfg):
        out["config"] = os.path.join(base_dir, cfg)
    return out


def load_config(args: dict[str, Any] | None) -> PipelineConfig:
    """The pipeline config of an application's ``args``: under ``config`` (inline, or a path
    to a YAML/JSON file of it), or its fields given as the args themselves."""
    args = dict(args or {})
    cfg = args.pop("config", None)
    if isinstance(cfg, str):
        cfg = read(cfg)
    if cfg is None:
        cfg = args  # the fields given directly as args
    elif args:
        raise ValueError(
            f"give the pipeline config under 'config' or as args, not both: {sorted(args)}"
        )
    return PipelineConfig.model_validate(cfg or {})
