"""The ``ferry`` command: ``python -m pipeline``'s commands plus those that need Serve.

    ferry classify IMAGE ...          # as python -m pipeline classify
    ferry models [FILE ...] [--no-load] [--json]   # list and check a config's model repository
    ferry config check FILE [FILE...] [--gpus N] [--no-load]   # Serve's, Ferry's, the models
    ferry metrics-url [--address ADDR]   # the running cluster's metrics endpoint(s)

``config check`` takes a Serve config file (``serve run`` / ``serve deploy``; checked with
``ray.serve.schema.ServeDeploySchema``, as ``serve deploy`` does, its ``grpc_options``
checked to serve Ferry's gRPC service (``deployments.grpc_proxy``), then every application
that imports ``deployments.app:build_app`` is validated with Ferry's ``PipelineConfig``,
checked by ``pipeline.check.check`` -- its engines and files, ``gpus: auto`` as ``--gpus``
GPUs -- and built, without starting Ray) or a bare pipeline config (YAML or JSON: the fields
of ``PipelineConfig``; ``deployments/config_file.py`` reads both). Unless ``--no-load``, the same check loads each application's models
as its inference replica loads them (``pipeline.check.check_models``: the engine built and
checked, every bucket planned -- on the device when there is one, else on numpy); a model
refused there fails the check, naming the model and the reason (for an ONNX file the node
and the op). It prints one line per check and exits 1 on the first file that
fails. It lives here, not in ``pipeline/``, because ``pipeline/`` never imports
``ray.serve``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from ray.serve.schema import ServeDeploySchema

from deployments.app import build
from deployments.config_file import load_config
from pipeline.__main__ import main as pipeline_main
from pipeline.check import ModelsDoNotLoad, check
from pipeline.config import PipelineConfig
from pipeline.placement import Cluster

from .cli_metrics import main as metrics_url_main
from .cli_models import main as models_main
from .config_file import FERRY_APP, app_args, base_dir_of, read
from .grpc_proxy import SERVICE, SERVICER


def _errors(exc: Exception) -> str:
    """A pydantic error as 'loc: message' lines; anything else as its text."""
    errs = getattr(exc, "errors", None)
    if callable(errs):
        try:
            return "\n".join(
                "  " + ".".join(str(p) for p in e.get("loc", ())) + ": " + e.get("msg", "")
                for e in errs()
            )
        except Exception:
            pass
    return f"  {exc}"


def _check_pipeline(
    args: dict[str, Any] | None, where: str, base_dir: str, gpus: int, load: bool = True
) -> list[str]:
    """Validate, check (``pipeline.check``: files, engines, ``gpus: auto`` as ``gpus`` GPUs,
    with ``load`` the models loaded) and build one application's pipeline config; the
    summary lines."""
    notes: list[str] = []
    try:
        config = load_config(app_args(args, base_dir))
        config = check(config, Cluster(gpus=gpus), load=load, tell=notes.append)
    except ModelsDoNotLoad as exc:
        raise ModelsDoNotLoad(f"{where}: {exc}") from None
    build(config)  # the deployments and their options, as `serve run` makes them
    return [_summary(config, where), *(f"ok: {where}: {n}" for n in notes)]


def _summary(config: PipelineConfig, where: str) -> str:
    """The config's line: its models, backend and the GPUs the placed deployments ask for,
    or none (not "placed for 1 GPU")."""
    models = ", ".join(m.name for m in config.models)
    stages = config.gpu_stages()
    if stages:
        asked = "GPUs asked: " + ", ".join(
            f"{s} {d.num_replicas or 'autoscaled'} x {d.num_gpus:g}" for s, d in stages
        )
        if all(d.num_replicas for _, d in stages):
            asked += f" = {sum(d.num_replicas * d.num_gpus for _, d in stages):g}"
        if config.gpus != "auto":
            asked += f", replicas_per_gpu on {config.gpus} GPU(s)"
    else:
        asked = "no deployment asks for a GPU"
    return (
        f"ok: {where}: Ferry's pipeline config (models {models}; backend "
        f"{config.executor.backend}; {asked})"
    )


def check_file(path: str, gpus: int = 1, load: bool = True) -> list[str]:
    """The lines of a passing check; raises ValueError with the reasons when it fails."""
    raw = read(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a mapping")
    base = base_dir_of(path)
    lines = []
    if "applications" not in raw:  # a bare pipeline config
        try:
            lines += _check_pipeline({"config": raw}, path, base, gpus, load)
        except ModelsDoNotLoad:
            raise
        except Exception as exc:
            raise ValueError(f"{path}: Ferry's pipeline config:\n{_errors(exc)}") from None
        return lines
    try:
        ServeDeploySchema.model_validate(raw)
    except Exception as exc:
        raise ValueError(f"{path}: Serve's schema (serve deploy):\n{_errors(exc)}") from None
    lines.append(f"ok: {path}: Serve's schema ({len(raw['applications'])} application(s))")
    for app in raw["applications"]:
        where = f"{path}: application {app.get('name', '?')!r}"
        if app.get("import_path") != FERRY_APP:
            lines.append(f"skipped: {where}: imports {app.get('import_path')!r}, not Ferry")
            continue
        try:
            lines += _check_pipeline(app.get("args"), where, base, gpus, load)
        except ModelsDoNotLoad:
            raise
        except Exception as exc:
            raise ValueError(f"{where}: Ferry's pipeline config:\n{_errors(exc)}") from None
    return lines + [_grpc(raw, path)]


def _grpc(raw: dict[str, Any], path: str) -> str:
    """The gRPC line of a Serve config: Ferry's service on ``grpc_options.port`` (its
    servicer function imports; the port is not HTTP's), or why there is no gRPC. Serve starts
    its gRPC server only where ``grpc_servicer_functions`` names a function."""
    opts = raw.get("grpc_options") or {}
    named = list(opts.get("grpc_servicer_functions") or [])
    port = opts.get("port", 9000)
    if SERVICER not in named:
        if named or "port" in opts:
            return (
                f"note: {path}: grpc_options does not name {SERVICER}: Ferry's "
                f"{SERVICE} is not served over gRPC"
            )
        return (
            f"ok: {path}: HTTP only (grpc_options.grpc_servicer_functions: [{SERVICER}] adds gRPC)"
        )
    if port == (raw.get("http_options") or {}).get("port", 8000):
        raise ValueError(f"{path}: grpc_options.port {port} is HTTP's port too")
    for name in named:
        module, _, attr = name.rpartition(".")
        try:
            if not callable(getattr(importlib.import_module(module), attr)):
                raise TypeError("not callable")
        except Exception as exc:
            raise ValueError(
                f"{path}: grpc_options.grpc_servicer_functions: {name}: {exc}"
            ) from None
    return f"ok: {path}: gRPC on port {port} ({SERVICE}: tritonclient.grpc, perf_analyzer -i grpc)"


def _config(args: argparse.Namespace) -> int:
    for path in args.files:
        try:
            for line in check_file(path, args.gpus, not args.no_load):
                print(line)
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["models"]:
        return models_main(argv[1:])
    if argv[:1] == ["metrics-url"]:
        return metrics_url_main(argv[1:])
    if argv[:1] != ["config"]:
        if argv[:1] in ([], ["-h"], ["--help"]):
            print(__doc__)
        return pipeline_main(argv)
    ap = argparse.ArgumentParser(
        prog="ferry config",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate config files with Serve's and Ferry's schemas")
    c.add_argument("files", nargs="+")
    c.add_argument(
        "--gpus", type=int, default=1, help="the cluster's GPUs, for configs saying gpus: auto"
    )
    c.add_argument(
        "--no-load",
        action="store_true",
        help="check the config only; do not load the models as the inference replica does",
    )
    c.set_defaults(fn=_config)
    args = ap.parse_args(argv[1:])
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
