"""The files ``bench_e2e.py`` hands ``serve run`` for the systems of ``e2e_systems.py``, the
experiments' ``--set`` overrides (``parse_sets``, ``apply_sets``), the rows' names, and the
URL each system's load goes to (Serve's port, or a Ferry system's own listener)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import yaml

from benchmarks.e2e_systems import BASE, WORKLOADS


def parse_sets(items: list[str]) -> dict[str, Any]:
    """``["executor.max_in_flight=4", ...]`` -> ``{"executor.max_in_flight": 4}`` (values YAML)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or key.startswith(".") or key.endswith("."):
            raise ValueError(f"--set wants section.key=value, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


def apply_sets(pipeline: dict[str, Any], sets: dict[str, Any]) -> dict[str, Any]:
    """``pipeline`` (a Ferry config dict) with each dotted key set; missing sections made."""
    for key, value in sets.items():
        *path, leaf = key.split(".")
        node = pipeline
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {part} is not a section")
        node[leaf] = value
    return pipeline


def row_name(name: str, spec: dict[str, Any], sets: dict[str, Any], mps: bool = False) -> str:
    """The system's row name: ``--set``s in brackets (Ferry's), ``+mps`` under CUDA MPS."""
    tail = "+mps" if mps else ""
    if spec["kind"] != "ferry" or not sets:
        return name + tail
    return f"{name}[{','.join(f'{k}={v}' for k, v in sets.items())}]{tail}"


def peer_app(module: str, args: dict[str, Any], route_prefix: str, port: int = 8000) -> dict:
    """The Serve config of a peer app: ``benchmarks.peers.MODULE:build_app`` with ``args``,
    at ``route_prefix`` on ``port``."""
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": port},
        "logging_config": {"encoding": "TEXT", "log_level": "WARNING"},
        "applications": [
            {
                "name": "peer",
                "route_prefix": route_prefix,
                "import_path": f"benchmarks.peers.{module}:build_app",
                "args": args,
            }
        ],
    }


def _ferry_config(spec: dict[str, Any], sets: dict[str, Any] | None) -> dict[str, Any]:
    """A Ferry system's Serve config: its file with its own sets, then the run's."""
    with open(spec["config"]) as f:
        cfg = yaml.safe_load(f)
    pipeline = cfg["applications"][0]["args"]["config"]
    if spec.get("naive"):
        pipeline["executor"]["mode"] = "naive"
    apply_sets(pipeline, {**spec.get("sets", {}), **(sets or {})})
    return cfg


def serve_config(name: str, spec: dict[str, Any], sets: dict[str, Any] | None = None) -> str:
    """The file ``serve run`` gets for ``spec``: a temporary YAML, for the caller to delete."""
    if spec["kind"] == "ferry":
        cfg = _ferry_config(spec, sets)
    else:
        cfg = peer_app(spec["module"], spec["args"], WORKLOADS[spec["workload"]].peer_path)
    fd, path = tempfile.mkstemp(prefix=f"{name}_", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(cfg, f)
    return path


def own_port(pipeline: dict[str, Any]) -> int | None:
    """A Ferry config's own listener's port (``ingress.direct_port``), None without one."""
    return (pipeline.get("ingress") or {}).get("direct_port")


def direct_port(spec: dict[str, Any], sets: dict[str, Any] | None = None) -> int | None:
    """A Ferry system's own listener's port, in the config ``serve_config`` writes for it
    (the run's ``sets`` too); None where it has none (a peer, or Serve's port only)."""
    if spec["kind"] != "ferry":
        return None
    return own_port(_ferry_config(spec, sets)["applications"][0]["args"]["config"])


def url_of(spec: dict[str, Any], sets: dict[str, Any] | None = None) -> str:
    """The URL a system's load goes to (its workload's route): through Ferry's own listener
    where the system has one (``direct_port``), else through Serve's port."""
    url = WORKLOADS[spec["workload"]].url(spec)
    port = direct_port(spec, sets)
    return url if port is None else url.replace(BASE, f"http://127.0.0.1:{port}", 1)
