"""How ``bench_e2e.py`` merges a run into its output file (``e2e.json``): what the file keeps of
its earlier runs, what a run measuring a system again sets aside, and what goes back where the
run did not measure it after all (not started, cut by the budget)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from benchmarks.common import commit, gpu_name, run_no, today
from benchmarks.e2e_configs import row_name
from benchmarks.e2e_systems import SYSTEMS, WORKLOADS
from loadtest.corpus import Corpus

WRITTEN = ("machine", "date", "corpora", "runs", "method", "rows", "ferry_breakdown")
"""The output file's top-level keys this script writes; others (added by hand: ``profiles``,
``peer_notes``...) are carried over as they are."""


def kept(
    args: argparse.Namespace, corpora: list[Corpus]
) -> tuple[
    list[dict[str, Any]], dict[str, Any], dict[str, str], dict[str, str], dict[str, Any], dict
]:
    """What the output file keeps of its earlier runs -- every row and breakdown but those
    this run measures again -- with this run's corpora and run note added, its other
    top-level keys (``extra``), of which ``peer_notes`` loses the systems measured again
    (a note on a system's rows goes with them), and what was set aside for the systems
    measured again (``displaced``: rows, breakdowns, notes), which ``merged`` puts back for
    any system and corpus this run ends up not measuring (not started, cut)."""
    sets, names = args.sets, args.names
    previous = json.load(open(args.out)) if os.path.exists(args.out) else {}
    measuring = {(row_name(s, SYSTEMS[s], sets, args.mps), c.name) for s in names for c in corpora}
    again = {system for system, _ in measuring}
    displaced: dict[str, Any] = {"rows": [], "breakdown": {}, "peer_notes": {}}
    rows = []
    for r in previous.get("rows", []):
        (displaced["rows"] if (r["system"], r["corpus"]) in measuring else rows).append(r)
    breakdown = {}
    for k, v in previous.get("ferry_breakdown", {}).items():
        aside = tuple(k.split("@")[:2]) in measuring
        (displaced["breakdown"] if aside else breakdown)[k] = v
    described = {**previous.get("corpora", {}), **{c.name: c.description for c in corpora}}
    runs = dict(previous.get("runs", {}))
    w = WORKLOADS[args.workload]
    runs[f"run{max(map(run_no, runs), default=0) + 1}"] = (
        f"{today()}, commit {commit()}, {getattr(args, 'gpu', None) or gpu_name()}: "
        f"{', '.join(names)} on {', '.join(c.name for c in corpora)}"
        + (f" ({w.name}: {w.model})" if w.name != "classify" else "")
        + (f", with {sets}" if sets else "")
    )
    extra = {k: v for k, v in previous.items() if k not in WRITTEN}
    if isinstance(extra.get("peer_notes"), dict):
        notes = extra["peer_notes"]
        displaced["peer_notes"] = {k: v for k, v in notes.items() if k in again}
        extra["peer_notes"] = {k: v for k, v in notes.items() if k not in again}
    return rows, breakdown, described, runs, extra, displaced


def merged(
    rows: list[dict[str, Any]],
    breakdown: dict[str, Any],
    runs: dict[str, str],
    extra: dict[str, Any],
    displaced: dict,
    new: set[tuple[str, str]],
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, str], dict[str, Any]]:
    """The file's rows, breakdowns, runs and extra keys as written: ``displaced`` put back
    for each (system, corpus) not in ``new`` (those this run measured), and every run that
    no row names any more dropped (the newest run, this one, stays)."""
    back = [r for r in displaced["rows"] if (r["system"], r["corpus"]) not in new]
    rows_out = rows + back
    bd = {**breakdown}
    for k, v in displaced["breakdown"].items():
        if tuple(k.split("@")[:2]) not in new:
            bd.setdefault(k, v)
    measured = {system for system, _ in new}
    if displaced["peer_notes"]:
        notes = {k: v for k, v in displaced["peer_notes"].items() if k not in measured}
        extra = {**extra, "peer_notes": {**extra.get("peer_notes", {}), **notes}}
    live = {r.get("run") for r in rows_out} | {max(runs, key=run_no)}
    return rows_out, bd, {k: v for k, v in runs.items() if k in live}, extra
