"""``ferry models [FILE ...] [--no-load] [--json]``: list and check a model repository;
``ferry models --ops``: the ONNX ops the onnx engine runs.

The repository is a config's ``models`` list (``pipeline/models/repository.py``): FILE is a
Serve config (every application that imports Ferry) or a bare pipeline config; with no FILE,
the default config's. For each entry: its engine and source, the input it is prepared for
(size, channels, layout, resize, dtype), its task, its labels, its batch limits (the largest batch on
the config's backend -- the GPU's or numpy's -- and the rows a v2 request may carry), the v2
names it answers to, and -- unless ``--no-load`` -- whether it loads and in which compute
dtype (its ``precision``: the float16 probe's verdict and measure, where it ran on the
backend's float16; ``pipeline/executor_precision.py``). That verdict is the
shared check's (``pipeline/check.py``), the one ``ferry config check`` and the inference
replica run: the entry's engine and files (``entry_problems``), then every model of the
config loaded as the replica loads it (``check_models``: the engine built and checked, every
bucket planned, on the device where there is one, else on numpy). For an entry that loads,
its own tensors are printed (its engine built once more, to read them). Exit status 1 when
any entry fails. ``--ops`` prints, whole, the list an ONNX file's refusal ("this op is not
supported") points to.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from pipeline.check import check_models, entry_problems
from pipeline.config import PipelineConfig, Settings
from pipeline.importers.onnx_graph import FOLDED_OPS, OPSETS, supported_ops
from pipeline.models.repository import load_entry, model_card, random_weights
from pipeline.protocol.encoded import views
from pipeline.tasks.spec import resolve_task

from .config_file import FERRY_APP, app_args, base_dir_of, load_config, read


def configs_of(path: str | None) -> list[tuple[str, PipelineConfig]]:
    """(where, PipelineConfig) of every Ferry application a file holds."""
    if path is None:
        return [("default config", PipelineConfig())]
    raw = read(path)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: not a mapping")
    if "applications" not in raw:
        return [(path, load_config({"config": raw}))]
    base = base_dir_of(path)  # relative config paths as `serve run` reads them
    return [
        (
            f"{path}: application {app.get('name', '?')!r}",
            load_config(app_args(app.get("args"), base)),
        )
        for app in raw["applications"]
        if app.get("import_path") == FERRY_APP
    ]


BACKENDS = {
    "numpy": "numpy (CPU)",
    "cupy": "cupy (GPU)",
    "auto": "cupy (GPU) where a CUDA device is visible, else numpy (CPU)",
}


def backend_of(config: PipelineConfig) -> str:
    """The backend the config's executor runs on (``auto``: ``FERRY_BACKEND`` where set, as
    the executor reads it)."""
    kind = config.executor.backend
    return (Settings.from_env().backend or kind) if kind == "auto" else kind


def describe(config: PipelineConfig, entry: Any) -> dict[str, Any]:
    """One entry of the repository, as the config gives it (nothing loaded)."""
    card = model_card(entry)
    i = card.image
    buckets = list(config.batch_of(entry.name).buckets)
    return {
        "name": entry.name,
        "engine": entry.engine,
        "compile": entry.compile if entry.engine == "torch" else None,  # (on a GPU)
        "source": entry.source,
        "weights": entry.weights or ("random" if random_weights(entry) else "bundled"),
        "task": entry.task,  # None: its outputs tell it (resolved below when it loads)
        "precision": entry.precision,  # the entry's; what it computes in when it loads, below
        "input": {
            "height": i.height,
            "width": i.width,
            "channels": i.channels,
            "layout": i.layout,
            "resize": i.resize,
            "dtype": card.input_dtype,
        },
        "labels": (
            {"count": len(card.labels), "from": entry.labels or "built-in"}
            if card.labels
            else {"count": None, "from": "class numbers"}
        ),
        "max_batch": {
            "batch": max(buckets) if buckets else None,
            "backend": backend_of(config),
            "buckets": buckets,
            "v2_request_rows": config.request_rows,
        },
        "v2_names": [entry.name]  # and its encoded view, unless a model has that name
        + [v for v, m in views(e.name for e in config.models).items() if m == entry.name],
    }


def checked(config: PipelineConfig, rows: list[dict[str, Any]]) -> None:
    """Each row's verdict from the shared check: ``loads``, else ``error`` (its reason)."""
    problems = {e.name: entry_problems(e) for e in config.models}
    report, _backend = check_models(config)
    for entry, row in zip(config.models, rows, strict=True):
        why = "; ".join(problems[entry.name]) or report.refused.get(entry.name)
        row["loads"] = why is None
        if why is not None:
            row["error"] = why
            continue
        row["precision"] = report.precision[entry.name].as_dict()  # dtype chosen at load
        eng = load_entry(entry).engine  # its tensors, as the replica's engine has them
        row["task"] = resolve_task(entry, model_card(entry), tuple(eng.outputs)).kind
        row["tensors"] = {
            "inputs": [_spec(t) for t in eng.inputs],
            "outputs": [_spec(t) for t in eng.outputs],
        }


def _precision(p: str | dict[str, Any]) -> str:
    """The compute dtype chosen at load (and why), else the entry's ``precision``."""
    if isinstance(p, dict):
        return p["why"]
    if p == "auto":
        return "auto (the executor's dtype; float16 probed against float32 when it loads)"
    return f"{p} (the entry's)"


def _compile(form: str | None) -> str:
    """How a torch model is compiled on a GPU, for its engine line."""
    if form is None:
        return ""
    return " (on a GPU: " + (
        "one compile for every bucket)" if form == "dynamic" else "one compile a bucket)"
    )


def _spec(t: Any) -> dict[str, Any]:
    return {"name": t.name, "dtype": np.dtype(t.dtype).name, "shape": list(t.shape)}


def text(row: dict[str, Any]) -> str:
    i, lab, mb = row["input"], row["labels"], row["max_batch"]
    state = {True: "ok, loads", False: "FAILS to load", None: "not loaded (--no-load)"}
    lines = [
        f"{row['name']}: {state[row.get('loads')]}",
        f"  engine {row['engine']}{_compile(row['compile'])}, source {row['source']}, "
        f"weights {row['weights']}",
        f"  input {i['height']}x{i['width']}x{i['channels']} {i['layout']}, resize "
        f"{i['resize']}, {i['dtype']}",
        f"  task: {row['task'] or 'told by its outputs when it loads'}",
        f"  precision: {_precision(row['precision'])}",
        f"  labels: {lab['count'] or 'none'} ({lab['from']})",
        f"  max batch: {mb['batch']} on {BACKENDS.get(mb['backend'], mb['backend'])}, "
        f"buckets {mb['buckets']}; {mb['v2_request_rows']} rows a v2 request",
        f"  v2: {', '.join(row['v2_names'])}",
    ]
    for kind, ts in row.get("tensors", {}).items():
        lines.append(
            f"  {kind}: " + ", ".join(f"{t['name']} {t['dtype']} {t['shape']}" for t in ts)
        )
    if "error" in row:
        lines.append(f"  error: {row['error']}")
    return "\n".join(lines)


def ops(as_json: bool) -> int:
    """The ONNX ops Ferry's importer runs, whole (what a refusal points to)."""
    run = supported_ops()
    if as_json:
        print(json.dumps({"ops": list(run), "folded": list(FOLDED_OPS), "opsets": list(OPSETS)}))
        return 0
    print(f"ONNX ops the onnx engine runs ({len(run)}; opsets {OPSETS[0]}-{OPSETS[1]}):")
    for op in run:
        print(f"  {op}")
    print("folded away when the file loads: " + ", ".join(FOLDED_OPS))
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="ferry models",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "files", nargs="*", help="Serve or pipeline config files (default: the default config)"
    )
    ap.add_argument("--no-load", action="store_true", help="list only; do not build the engines")
    ap.add_argument("--json", action="store_true", help="one JSON object: {where: [entries]}")
    ap.add_argument(
        "--ops", action="store_true", help="print the ONNX ops the onnx engine runs, and exit"
    )
    args = ap.parse_args(argv)
    if args.ops:
        return ops(args.json)
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        for path in args.files or [None]:
            for where, config in configs_of(path):
                out[where] = [describe(config, m) for m in config.models]
                if not args.no_load:
                    checked(config, out[where])
    except (OSError, ValueError) as exc:  # an unreadable or invalid config (pydantic's too)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for where, rows in out.items():
            print(f"# {where}")
            for row in rows:
                print(text(row))
    return 1 if any(r.get("loads") is False for rows in out.values() for r in rows) else 0
