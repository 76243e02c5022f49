"""Reading Ferry's config files: a Serve config (``serve run`` / ``serve deploy``) whose
applications import ``FERRY_APP``, or a bare pipeline config (the fields of
``PipelineConfig``), YAML or JSON -- for ``ferry config check`` and ``ferry models``.

    raw = read("serve_config.yaml")
    for app in raw["applications"]:
        args = app_args(app.get("args"), base_dir_of("serve_config.yaml"))
"""

from __future__ import annotations

import json
import os
from typing import Any

import yaml

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
