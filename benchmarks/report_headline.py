"""RESULTS.md's headline: the current figure of each benchmark, the commit and date it was
measured at, and whether the code it measures changed since."""

from __future__ import annotations

import re

from benchmarks.report_base import load
from benchmarks.report_e2e import firsts, peaks, ratio_text, same_run_ratio, settled

# Where a result's JSON has no ``commit``: the commit it was measured at, from its run notes
# (e2e's ``runs``) or, where those name none, the commit that added the result ("added in":
# ``git log -S`` on the figure in benchmarks/results/). Keyed by file, or file:section.
MEASURED_AT = {
    "e2e.json": "674d82a",
    "engine.json": "734acef (added in)",
    "models.json": "3f5958b (added in)",
    "alloc.json": "f5be890 (added in)",
    "transport.json": "1a2d869 (added in)",
    "reliability.json:overload": "2a16cb8 (added in)",
    "reliability.json:chaos": "d0a8298 (added in)",
}


def _run_of(doc: dict, row: dict) -> tuple[str, str]:
    """(commit and date, GPU) of the run a row of e2e.json comes from: its runs differ."""
    note = doc.get("runs", {}).get(row.get("run"), "")
    at = re.search(r"commit ([0-9a-f]{7})", note)
    day = re.match(r"(\d{4}-\d\d-\d\d)", note)
    when = f"{at.group(1) if at else MEASURED_AT['e2e.json']}, {day.group(1) if day else '?'}"
    return when, row.get("gpu") or str(doc.get("machine", "?")).split(",")[0]


def _e2e(doc: dict) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for corpus in ("chelsea", "photos"):
        rows = settled(firsts([r for r in doc["rows"] if r["corpus"] == corpus]))
        if not rows or not any(r["system"] == "ferry" for r in rows):
            continue
        peak = peaks(rows)
        f = {r["clients"]: r for r in rows if r["system"] == "ferry"}
        top = max(f.values(), key=lambda r: r["img_s"])
        cpu = top.get("server_cpu_ms_per_img")
        where = _run_of(doc, top)
        out.append(
            (
                f"Ferry end to end, peak img/s ({corpus} JPEG, HTTP; server CPU ms per image)",
                f"{peak['ferry']:,.0f} at {top['clients']} clients"
                + (f" ({cpu:.1f} ms)" if cpu else "")
                + (f", {top['run']}" if top.get("run") else ""),
                *where,
            )
        )
        peers = {s: v for s, v in peak.items() if s.startswith("rayserve")}
        if peers:
            best = max(peers, key=peers.get)
            top_peer = max((r for r in rows if r["system"] == best), key=lambda r: r["img_s"])
            out.append(
                (
                    f"the same, over the best Ray Serve peer measured ({corpus})",
                    (
                        f"{r} `{best}`"
                        if not (r := ratio_text(rows, best, peak)).startswith("no ratio")
                        else f"`{best}`: {r}"
                    )
                    + (f" ({note})" if (note := doc.get("peer_notes", {}).get(best)) else "")
                    + same_run_ratio(rows, peers, best, peak),
                    *_run_of(doc, top_peer),
                )
            )
        elif note := doc.get("peer_notes", {}).get("rayserve_expert_8"):
            out.append(
                (f"the same, over the expert Ray Serve peer ({corpus})", f"no ratio: {note}")
            )
        lat = [f"p99 {f[256]['p99_ms']:.0f} ms at 256 clients"] if 256 in f else []
        lat += [f"p50 {f[1]['p50_ms']:.1f} ms at one client"] if 1 in f else []
        if lat:
            out.append((f"latency ({corpus})", ", ".join(lat), *where))
    return out


def _engine(doc: dict) -> list[tuple[str, str]]:
    b = {r["batch"]: r for r in doc["rows"]}
    lo, hi = min(b), max(b)
    return [
        (
            f"ResNet-50 fp16 engine img/s, batch {lo} / {hi} (x torchvision CUDA graph)",
            f"{b[lo]['ferry_img_s']:,.0f} ({b[lo]['vs_torch_graph']:.2f}x) / "
            f"{b[hi]['ferry_img_s']:,.0f} ({b[hi]['vs_torch_graph']:.2f}x)",
        )
    ]


def _models(doc: dict) -> list[tuple[str, str]]:
    by = {(r["model"], r["batch"], r["system"]): r["img_s"] for r in doc["rows"]}
    out = []
    for system, what in (
        ("ferry_torch", "torch engine"),
        ("ferry_onnx", "onnx engine (torch backend) on the same models exported to ONNX"),
    ):
        ratios: dict[int, list[float]] = {}
        for (model, batch, s), v in by.items():
            if s == system and (model, batch, "torch_compile") in by:
                ratios.setdefault(batch, []).append(v / by[(model, batch, "torch_compile")])
        if not ratios:
            continue
        cells = [
            f"{sorted(r)[len(r) // 2]:.2f}x at {b} (min {min(r):.2f})"
            for b, r in sorted(ratios.items())
        ]
        n = len({m for m, _b, s in by if s == system})
        out.append((f"{what} over torch's own CUDA graphs, median of {n} models", ", ".join(cells)))
    return out


def _alloc(doc: dict) -> list[tuple[str, str]]:
    top = max(r["threads"] for r in doc["rows"])
    p99 = {r["mode"]: r["p99_us"] for r in doc["rows"] if r["threads"] == top}
    return [
        (
            f"device pool p99 reservation, {top} threads (raw cudaMalloc/cudaFree)",
            f"{p99['ferry']:.1f} us ({p99['raw'] / 1e3:,.0f} ms)",
        )
    ]


def _transport(doc: dict) -> list[tuple[str, str]]:
    big = max(doc["ratios"], key=lambda r: r["bytes"])
    gb = {r["path"]: r["gb_s"] for r in doc["rows"] if r["bytes"] == big["bytes"]}
    return [
        (
            f"NCCL channel between two GPUs, {big['bytes'] >> 20} MB (x raw NCCL)",
            f"{gb['ferry_nccl']:.0f} GB/s ({big['ferry_nccl_vs_raw']:.2f}x)",
        )
    ]


def _overload(doc: dict, where: str) -> list[tuple[str, str]]:
    run = doc.get("runs", {})
    on, off = run.get("budget", {}).get("verdict", {}), run.get("no_budget", {}).get("verdict", {})
    if "ratio" not in on:
        return []
    peer = f" ({off['ratio']}x without the budget)" if "ratio" in off else ""
    return [
        (f"overload pulse {where}: accepted p99 in bursts / steady p99", f"{on['ratio']}x{peer}")
    ]


def _chaos(ch: dict) -> list[tuple[str, str]]:
    return [
        (
            f"replicas killed under load ({ch['machine']}): requests that succeeded",
            f"{ch['succeeded']:,} of {ch['requests']:,}",
        )
    ]


# (result file, its section or None, the figure rows, whether the code it measures has
# changed since the run -- judged when the row was written; a rerun replaces the figures)
HEADLINE = [
    (
        "e2e.json",
        None,
        _e2e,
        "yes",
    ),
    (
        "engine.json",
        None,
        _engine,
        "older than the code: the executor's host path and modes "
        "have changed since. Rerun `bench_engine.py`.",
    ),
    (
        "models.json",
        None,
        _models,
        "yes",
    ),
    (
        "alloc.json",
        None,
        _alloc,
        "older than the code: the pool's locking and accounting have "
        "changed since. Rerun `bench_alloc.py`.",
    ),
    (
        "transport.json",
        None,
        _transport,
        "older than the code: `pipeline/transport/` was "
        "split since (one NCCL link a module). Rerun `bench_transport.py`.",
    ),
    (
        "reliability.json",
        "overload",
        lambda d: _overload(d, "on 2 CPU cores"),
        "older than the code: the serving layer has changed since. Rerun `overload.py`.",
    ),
    (
        "reliability.json",
        "overload_gpu",
        lambda d: _overload(d, "on an H200 (MPS)"),
        "older "
        "than the code: the serving layer has changed since. Rerun `scripts/gpu_overload.sh`.",
    ),
    (
        "reliability.json",
        "chaos",
        _chaos,
        "older than the code: the serving layer has changed since. Rerun `reliability_chaos.py`.",
    ),
]


def headline_section() -> list[str]:
    """The headline: the current figures, each with its commit and date, first."""
    lines = [
        "## Headline",
        "",
        "The current figures, each from the section below that names its benchmark. "
        '"Measured" is the commit and date of the run ("added in": the commit that added a '
        "result whose run did not record its own commit); the last column says whether the code "
        "it measures has changed since, i.e. whether the figure is older than the code.",
        "",
        "| figure | value | measured | machine | current? |",
        "|---|---|---|---|---|",
    ]
    for name, key, rows_of, since in HEADLINE:
        doc = load(name)
        part = (doc or {}).get(key) if key else doc
        if not part:
            continue
        commit = part.get("commit") or MEASURED_AT.get(f"{name}:{key}", MEASURED_AT.get(name, "?"))
        date = part.get("date") or doc.get("date", "?")
        machine = str(part.get("machine", doc.get("machine", "?"))).split("|")[0].split(",")[0]
        for figure, value, *where in rows_of(part):  # where: a figure's own (measured, machine)
            at, on = where or (f"{commit}, {date}", machine.strip())
            lines.append(f"| {figure} | {value} | {at} | {on} | {since} |")
    return lines + [""]
