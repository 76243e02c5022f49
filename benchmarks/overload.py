"""Overload (issue 17 item 4): locust's pulse shape against Ferry with its queue-time budget
and, as the peer in the same run, the same config with the budget off (``timeout_ms: null``:
requests queue up to ``batching.max_queue``, Ferry's old behaviour).

    python benchmarks/overload.py --config serve_config.yaml --users 8       # CPU default
    python benchmarks/overload.py --config serve_config.gpu.yaml --users 256 --out $OUT/overload

For each system: `serve run CONFIG` (a fresh local Ray), a warm-up, ``--users`` steady
clients for ``--steady-seconds`` (the unloaded figure: the sustained level alone), then the
pulse -- that level with bursts of ``--factor`` times it for a third of each period -- for
``--pulse-seconds``. Locust runs as its own process and logs every request
(``FERRY_EVENTS``), so the accepted requests' p99 within the bursts, the refusals and the
time they took are exact. The rejections by reason come from Ray's metrics endpoint.
Writes the ``overload`` section of results/reliability.json (``--no-write``: only
``--out``/overload.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import ray_probe  # noqa: E402
from benchmarks.common import commit, read_results, write_json, write_results  # noqa: E402
from loadtest.run import end_local_ray, run_level, start_app, wait_ready  # noqa: E402

RESULTS = os.path.join(HERE, "results", "reliability.json")
AT_ONCE = "_retry_at_once"  # a system whose refused clients ask again at once


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


def read_events(path: str) -> tuple[float, list[tuple[float, str, int, float, int, str, str]]]:
    """(the test's start -- the earliest ``start`` line --, its requests: wall time, name,
    status, ms, Ferry JSON, Retry-After, where: the refusing queue or the answer's time
    parts, when the events have it)."""
    start, rows = 0.0, []
    with open(path) as f:
        for line in f:
            p = line.rstrip("\n").split(",")
            if len(p) < 6:
                continue
            if p[1] == "start":  # with --processes, one a process: the first is locust's
                start = min(start or math.inf, float(p[0]))  # master, whose clock the shape keeps
                continue
            where = p[6] if len(p) > 6 else ""
            rows.append((float(p[0]), p[1], int(p[2]), float(p[3]), int(p[4]), p[5], where))
    return start, rows


def where_time_went(rows: list) -> dict[str, Any]:
    """Of the accepted requests, each ``timings_ms`` part's p50 and p99 (from the events'
    last column); of the refusals, how many each queue refused and why."""
    parts: dict[str, list[float]] = {}
    refused: dict[str, int] = {}
    for r in rows:
        where = r[6] if len(r) > 6 else ""
        if r[2] == 200 and where:
            for kv in where.split(";"):
                k, _, v = kv.partition("=")
                parts.setdefault(k, []).append(float(v))
        elif r[2] == 503:
            refused[where or "?"] = refused.get(where or "?", 0) + 1
    return {
        "accepted_parts_ms": {k: [pct(v, 0.5), pct(v, 0.99)] for k, v in sorted(parts.items())},
        "refused_by_queue": dict(sorted(refused.items())),
    }


def summarize(rows: list, seconds: float) -> dict[str, Any]:
    ok = [r[3] for r in rows if r[2] == 200]
    shed = [r for r in rows if r[2] == 503]
    other = {}
    for r in rows:
        if r[2] not in (200, 503):
            other[str(r[2])] = other.get(str(r[2]), 0) + 1
    return {
        "requests": len(rows),
        "accepted": len(ok),
        "accepted_per_s": round(len(ok) / seconds, 2) if seconds else None,
        "accepted_p50_ms": pct(ok, 0.50),
        "accepted_p99_ms": pct(ok, 0.99),
        "refused_503": len(shed),
        "refused_share": round(len(shed) / len(rows), 3) if rows else None,
        "refusal_p50_ms": pct([r[3] for r in shed], 0.50),
        "refusal_p99_ms": pct([r[3] for r in shed], 0.99),
        "refusals_not_ferry_json": sum(1 for r in shed if not r[4]),
        "refusals_without_retry_after": sum(1 for r in shed if not r[5]),
        "other_statuses": other,
        **where_time_went(rows),
    }


def pulse_split(
    start: float, rows: list, period: float, burst: float, settle: float, duration: float
) -> dict:
    """The pulse's requests by phase (by the time each was answered, minus its latency: when
    it was sent): ``burst`` windows, and ``base`` windows from ``settle`` s after a burst.
    Rates are over the windows' seconds within the pulse's ``duration`` (the time the
    windows held, not a count of periods from the last answer, which runs past the end)."""
    base, hi = [], []
    for r in rows:
        t = r[0] - r[3] / 1e3 - start
        ph = t % period
        if ph >= period - burst:
            hi.append(r)
        elif ph >= settle or t < period - burst:
            base.append(r)
    t_hi, t_base = window_seconds(period, burst, settle, duration)
    return {"burst": summarize(hi, t_hi), "base": summarize(base, max(1.0, t_base))}


def window_seconds(
    period: float, burst: float, settle: float, duration: float
) -> tuple[float, float]:
    """Seconds of burst and of base windows (as ``pulse_split`` assigns them) in ``duration``:
    a period's last ``burst`` s are its burst; the base is the rest, less ``settle`` s after
    each burst (the first period, before any burst, is base from its start)."""
    t_hi = t_base = 0.0
    k = 0
    while k * period < duration:
        p0 = k * period
        t_hi += max(0.0, min(duration, p0 + period) - (p0 + period - burst))
        t_base += max(0.0, min(duration, p0 + period - burst) - (p0 + (settle if k else 0.0)))
        k += 1
    return round(t_hi, 3), round(t_base, 3)


def one_system(args: argparse.Namespace, name: str, config: str, out: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{args.port}"
    os.makedirs(out, exist_ok=True)
    proc = start_app(config, os.path.join(out, "serve.log"))
    try:
        if not wait_ready(url, 300, proc):
            raise RuntimeError(f"{name}: not ready; see {out}/serve.log")
        run_level(url, 4, 15, out, "ClassifyUser", args.model)  # warm
        before = ray_probe.rejected()
        res: dict[str, Any] = {}
        for phase, seconds, shape in (
            ("steady", args.steady_seconds, None),
            ("pulse", args.pulse_seconds, "pulse"),
        ):
            ev = os.path.join(out, f"{phase}_events.csv")
            os.environ["FERRY_EVENTS"] = ev
            os.environ["FERRY_PULSE_USERS"] = str(args.users)
            os.environ["FERRY_HONOUR_RETRY_AFTER"] = "0" if name.endswith(AT_ONCE) else "1"
            try:
                run_level(
                    url, args.users, seconds, out, "ClassifyUser", args.model, shape, args.processes
                )
            finally:
                os.environ.pop("FERRY_EVENTS", None)
            start, rows = read_events(ev)
            if shape is None:
                res[phase] = summarize(rows, seconds)
            else:
                period = min(180.0, seconds / 2)
                res[phase] = pulse_split(
                    start, rows, period, period / 3, args.settle_seconds, seconds
                )
                res[phase]["all"] = summarize(rows, seconds)
        after = ray_probe.rejected()
        res["rejected_by_reason"] = {
            k: round(after.get(k, 0) - before.get(k, 0)) for k in sorted(set(after) | set(before))
        }
        return res
    finally:
        end_local_ray(proc)  # (inside the caller's lock: this run's Ray only)


def config_without_budget(path: str, tmp: str) -> str:
    """The same Serve config, every Ferry app's queue budget off."""
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    for app in doc["applications"]:
        b = app["args"]["config"].setdefault("batching", {})
        b["queue_policy"] = {"timeout_ms": None}
        b.pop("model_queue_policy", None)
    out = os.path.join(tmp, "no_budget.yaml")
    with open(out, "w") as f:
        yaml.safe_dump(doc, f)
    return out


def budget_of(path: str) -> Any:
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    b = doc["applications"][0]["args"]["config"].get("batching", {})
    return {
        "queue_policy": b.get("queue_policy", "default (1000 ms)"),
        **({"model_queue_policy": b["model_queue_policy"]} if "model_queue_policy" in b else {}),
    }


def verdict(res: dict[str, Any]) -> dict[str, Any]:
    unloaded = res["steady"]["accepted_p99_ms"]
    burst = res["pulse"]["burst"]["accepted_p99_ms"]
    ratio = round(burst / unloaded, 2) if unloaded and burst else None
    return {
        "unloaded_p99_ms": unloaded,
        "accepted_p99_in_bursts_ms": burst,
        "ratio": ratio,
        "within_2x": ratio is not None and ratio <= 2.0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=os.path.join(ROOT, "serve_config.yaml"))
    ap.add_argument("--users", type=int, default=8, help="the sustained level (pulse base)")
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--steady-seconds", type=float, default=60)
    ap.add_argument("--pulse-seconds", type=float, default=180)
    ap.add_argument("--settle-seconds", type=float, default=10, help="left out after a burst")
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--content-type", help="only the corpus files of this type (image/jpeg)")
    ap.add_argument(
        "--processes", type=int, default=1, help="locust worker processes (the GPU's load)"
    )
    ap.add_argument("--skip-peer", action="store_true", help="not the peer without a budget")
    ap.add_argument(
        "--systems",
        default="",
        help=f"a subset: budget, no_budget, budget{AT_ONCE} (comma-separated)",
    )
    ap.add_argument("--conditions", default="", help="what else ran on the machine")
    ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "ferry-overload"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--section", default="overload", help="reliability.json's key (overload_gpu on the GPU)"
    )
    args = ap.parse_args(argv)
    if args.factor != 3.0:
        raise SystemExit("loadtest.shapes.Pulse bursts to 3x; --factor is recorded, not applied")
    if args.content_type:
        os.environ["FERRY_CONTENT_TYPE"] = args.content_type  # read by the locust users
    tmp = tempfile.mkdtemp()
    systems = {"budget": args.config}
    if not args.skip_peer:
        systems["no_budget"] = config_without_budget(args.config, tmp)
    systems["budget" + AT_ONCE] = args.config  # the same, with clients that ignore Retry-After
    if args.systems:  # e.g. one per command where a command's time is bounded
        systems = {k: v for k, v in systems.items() if k in args.systems.split(",")}
    runs = {}
    for name, cfg in systems.items():
        print(f"== {name}: {cfg}", flush=True)
        t0 = time.time()
        runs[name] = one_system(args, name, cfg, os.path.join(args.out, name))
        runs[name]["verdict"] = verdict(runs[name])
        print(json.dumps(runs[name]["verdict"]), f"({time.time() - t0:.0f} s)", flush=True)
    import psutil

    doc = {
        "method": (
            f"locust ClassifyUser ({args.model}, loadtest/corpus photos"
            + (f", {args.content_type} only" if args.content_type else "")
            + ") as its own process"
            + (f" ({args.processes} workers)" if args.processes > 1 else "")
            + ": "
            f"{args.users} steady clients for {args.steady_seconds:.0f} s (unloaded), then "
            f"loadtest.shapes.Pulse for {args.pulse_seconds:.0f} s ({args.users} clients, "
            f"bursts to {round(args.users * args.factor)} for a third of each "
            f"{min(180.0, args.pulse_seconds / 2):.0f} s period; closed loop, no think time; "
            "a refused client waits the 503's Retry-After before it asks again, as README asks "
            f"of clients -- in budget{AT_ONCE} it asks again at once, a retry storm of many "
            "times the pulse); burst figures are the requests sent within "
            f"the bursts, base figures those sent from {args.settle_seconds:.0f} s after one"
        ),
        "config": os.path.relpath(args.config, ROOT),
        "budget": budget_of(args.config),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "conditions": f"{args.conditions}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}".lstrip("; "),
        "date": datetime.date.today().isoformat(),
        "commit": commit(),
        "runs": runs,
    }
    write_json(os.path.join(args.out, "overload.json"), doc)
    if not args.no_write:
        write_section(args.section, doc)
    print(json.dumps({k: v["verdict"] for k, v in runs.items()}, indent=2))
    return 0


def write_section(key: str, doc: dict[str, Any], path: str = RESULTS) -> None:
    """Put ``doc`` under ``key`` in reliability.json, leaving the other sections as they are.

    The runs it replaces become rows of its ``repeats`` (their spread stays in view)."""
    rel = read_results(path)
    old = rel.get(key) or {}
    if old.get("runs"):
        rows = [repeat_row(name, r, old) for name, r in old["runs"].items()]
        doc = {**doc, "repeats": old.get("repeats", []) + rows}
    rel[key] = doc
    write_results(path, rel)


def repeat_row(name: str, run: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """One ``repeats`` row: a run's figures, with the date and commit of the doc it came from."""
    v, b, steady = run["verdict"], run["pulse"]["burst"], run["steady"]
    return {
        "system": name,
        "date": doc.get("date", "?"),
        "commit": doc.get("commit", "?"),
        "unloaded_p99_ms": v["unloaded_p99_ms"],
        "accepted_p99_in_bursts_ms": v["accepted_p99_in_bursts_ms"],
        "ratio": v["ratio"],
        "accepted_per_s_in_bursts": b["accepted_per_s"],
        "refused_in_bursts": b["refused_503"],
        "refused_at_steady": f"{steady['refused_503']} of {steady['requests']}",
    }


def section(doc: dict[str, Any]) -> list[str]:
    """RESULTS.md lines of the overload section."""
    lines = [
        f"Overload ({doc['config']}, {doc['machine']}, {doc['date']}; {doc['conditions']}): "
        f"{doc['method']}. Budget: `{json.dumps(doc['budget'])}`.",
        "",
        "| system | unloaded p99 ms | accepted p99 in bursts ms | ratio | accepted/s in bursts "
        "| refused in bursts | refusal p50 / p99 ms | refused at the steady level "
        "| other statuses |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["runs"].items():
        v, b = r["verdict"], r["pulse"]["burst"]
        lines.append(
            f"| {name} | {v['unloaded_p99_ms']} | {v['accepted_p99_in_bursts_ms']} | "
            f"{v['ratio']}x | {b['accepted_per_s']} | {b['refused_503']} "
            f"({b['refused_share'] or 0:.0%}) | {b['refusal_p50_ms']} / {b['refusal_p99_ms']} | "
            f"{r['steady']['refused_503']} of {r['steady']['requests']} | "
            f"{r['pulse']['all']['other_statuses'] or 'none'} |"
        )
    for rep in doc.get("repeats", []):  # later runs of one system, kept for the spread
        lines.append(
            f"| {rep['system']} (repeat, {rep['date']}, {rep['commit']}) | "
            f"{rep['unloaded_p99_ms']} | {rep['accepted_p99_in_bursts_ms']} | {rep['ratio']}x | "
            f"{rep['accepted_per_s_in_bursts']} | {rep['refused_in_bursts']} | | "
            f"{rep['refused_at_steady']} | |"
        )
    return lines + (["", f"Note: {doc['note']}"] if doc.get("note") else [])


if __name__ == "__main__":
    sys.exit(main())
