"""RESULTS.md's perf_analyzer section (``perf_analyzer.json``): its headline run, the runs
kept beside it, its A/B experiments and where the CPU goes per protocol."""

from __future__ import annotations

from benchmarks.report_base import md_table


def perf_analyzer_sections(pa: dict) -> list[str]:
    """The headline run of perf_analyzer.json, then each run kept beside it (``--key``),
    then its A/B experiments (``experiments``: one setting's values side by side)."""
    out = [*perf_analyzer_section(pa), ""]
    for key, run in pa.get("runs", {}).items():
        out += [f"### `{key}`", "", *perf_analyzer_section(run), ""]
    for key, exp in pa.get("experiments", {}).items():
        out += [f"### Experiment: `{key}`", "", *experiment_section(key, exp), ""]
    for key, prof in pa.get("profiles", {}).items():
        out += [f"### Where the CPU goes: `{key}` (`profile_protocols.py`)", ""]
        out += [*protocol_profile_section(prof), ""]
    return out


def protocol_profile_section(prof: dict) -> list[str]:
    """profile_protocols.py's result: per run, perf_analyzer's infer/s and each busy
    process's CPU ms per request answered."""
    procs: list[str] = []
    groups = int(any("mean_group" in r for r in prof["rows"]))
    for r in prof["rows"]:
        for k, v in r["cpu_ms_per_request"].items():
            if v >= 0.02 and k not in procs:
                procs.append(k)
    lines = [
        f"{prof['machine']}; {prof['date']}; at {prof['commit']}; `{prof['config']}`, "
        f"{prof['model']}, concurrency {prof['concurrency']}, {prof['proxy']}. CPU ms per "
        "request answered, each process's idle burn taken off.",
        "",
        "| protocol | infer/s | "
        + " | ".join(p.replace("ServeReplica:", "") for p in procs)
        + " | total |"
        + (" requests an ingress call |" if groups else ""),
        "|---|---|" + "---|" * (len(procs) + 1 + groups),
    ]
    for r in prof["rows"]:
        c = r["cpu_ms_per_request"]
        total = sum(v for v in c.values() if v > 0)
        lines.append(
            f"| {r['protocol']} | {r.get('pa_infer_s', 'failed')} | "
            + " | ".join(f"{c.get(p, 0.0):.3f}" for p in procs)
            + f" | {total:.2f} |"
            + (f" {r.get('mean_group', '-')} |" if groups else "")
        )
    return lines + (["", prof["what"]] if prof.get("what") else [])


def experiment_section(key: str, exp: dict) -> list[str]:
    """perf_analyzer's infer/s for each value of ``key`` (rounds joined by ' / '), a row per
    protocol and concurrency, then the classify route's runs."""
    values = sorted({r[key] for r in exp["rows"]}, reverse=True)
    cells: dict[tuple, list[str]] = {}
    for r in exp["rows"]:
        cells.setdefault((r["protocol"], r["concurrency"], r[key]), []).append(
            f"{r['infer_s']:,.0f}" if r.get("infer_s") else "failed"
        )
    levels = sorted({(r["protocol"], r["concurrency"]) for r in exp["rows"]},
                    key=lambda pc: (pc[1], PROTOCOL_ORDER.get(pc[0], 9)))  # fmt: skip
    lines = [
        f"{exp['machine']}; {exp['date']}; at {exp['commit']}. {exp['what']}.",
        "",
        "| protocol | concurrency | " + " | ".join(f"{key} {v}, infer/s" for v in values) + " |",
        "|---|---|" + "---|" * len(values),
    ]
    for p, c in levels:
        row = [" / ".join(cells.get((p, c, v), ["-"])) for v in values]
        lines.append(f"| {p} | {c} | " + " | ".join(row) + " |")
    if exp.get("classify"):
        lines += ["", "| classify route | " + " | ".join(f"{key} {v}" for v in values) + " |",
                  "|---|" + "---|" * len(values)]  # fmt: skip
        for field, fmt in (
            ("img_s", "{:,.0f}"),
            ("p99_ms", "{:.0f}"),
            ("cpu_ms_per_request", "{:.2f}"),
        ):
            row = [
                " / ".join(fmt.format(r[field]) for r in exp["classify"] if r[key] == v) or "-"
                for v in values
            ]
            lines.append(f"| {field} | " + " | ".join(row) + " |")
    return lines


PROTOCOL_ORDER = {"http": 0, "grpc": 1, "grpc_stream": 2}


def perf_analyzer_section(pa: dict) -> list[str]:
    """perf_analyzer.json: perf_analyzer's figures over each protocol (a row without one is
    HTTP: the runs before gRPC), loadgen's for the same v2 requests over HTTP, the ratios."""
    rows = []
    for r in pa["rows"]:
        lg = r.get("loadgen") or {}
        rows.append(
            {
                "model": r["model"],
                "protocol": r.get("protocol", "http"),
                "conc": r["concurrency"],
                "pa": r["perf_analyzer"].get("infer_s", "failed"),
                "pa_p99": r["perf_analyzer"].get("p99_ms", ""),
                "lg": lg.get("img_s", ""),
                "lg_p99": lg.get("p99_ms", ""),
                "ratio": r.get("ratio", ""),
                "vs_http": r.get("vs_http", ""),
                "v1": r.get("loadgen_v1_classify", {}).get("img_s", ""),
            }
        )
    cols = [
        ("model", "model"),
        ("protocol", "protocol"),
        ("concurrency", "conc"),
        ("perf_analyzer infer/s", "pa"),
        ("its p99 ms", "pa_p99"),
        ("loadgen img/s", "lg"),
        ("its p99 ms", "lg_p99"),
        ("ratio", "ratio"),
        ("gRPC / HTTP", "vs_http"),
        ("loadgen v1 classify img/s", "v1"),
    ]
    return [
        f"{pa['machine']}; {pa['date']}; `{pa['config']}`. {pa['ratio']}; {pa['loadgen']}.",
        "",
        md_table(rows, cols),
    ]
