"""RESULTS.md's end-to-end section (``e2e.json``): per corpus the systems' rates by level,
Ferry's ratio to each peer measured in the same run, the issue's goals, where a request's
time goes, and what each run was."""

from __future__ import annotations

from benchmarks.common import run_no
from benchmarks.report_image import image_lines
from benchmarks.report_threads import thread_lines


def ratio_text(rows: list[dict], system: str, peak: dict[str, float]) -> str:
    """Ferry's peak over ``system``'s, or why it is no result: a row names its run (``run``)
    where e2e.json holds rows of more than one, and a ratio needs both systems from one."""
    if not same_run(rows, system):
        return "no ratio: the two systems' rows come from different runs"
    return f"{peak['ferry'] / peak[system]:.2f}x"


def same_run(rows: list[dict], system: str) -> bool:
    """Whether ``system``'s rows come from the same run(s) as Ferry's."""
    runs = {s: {r.get("run") for r in rows if r["system"] == s} for s in ("ferry", system)}
    return runs["ferry"] == runs[system]


def same_run_ratio(rows: list[dict], peers: dict[str, float], best: str, peak: dict) -> str:
    """Where the best peer's rows come from another run than Ferry's: Ferry over the best
    peer of its own run, as "; in ferry's own run: ..." (empty where there is none)."""
    mine = [s for s in peers if same_run(rows, s)]
    if same_run(rows, best) or not mine:
        return ""
    b = max(mine, key=peers.get)
    return f"; in ferry's own run: {ratio_text(rows, b, peak)} `{b}` ({peers[b]:,.0f} img/s)"


def settled(rows: list[dict]) -> list[dict]:
    """The rows measured with every replica of their system up: a row with
    ``replicas_starting`` (bench_e2e: the level began before the dashboard said every
    deployment was HEALTHY, or it could not tell) measured part of a system, so it is shown,
    marked, but is no peak, ratio or goal."""
    return [r for r in rows if not r.get("replicas_starting")]


def firsts(rows: list[dict]) -> list[dict]:
    """Each system's first measurement of a level: a level given again in one run (bench_e2e
    ``--clients 64,256,64,256``: ``repeat`` 2, 3...) is listed apart (``repeat_lines``)."""
    return [r for r in rows if not r.get("repeat")]


def repeat_lines(rows: list[dict]) -> list[str]:
    """A level measured again with its system still up: the first img/s, then each repeat's."""

    def level(r: dict) -> tuple:
        return r["system"], r["clients"], r.get("run")

    first = {level(r): r["img_s"] for r in firsts(rows)}
    out = []
    for r in rows:
        if r.get("repeat"):
            was = f"{first[level(r)]:,.0f}" if level(r) in first else "?"
            out.append(
                f"* `{r['system']}` at {r['clients']} clients again (repeat {r['repeat']}, "
                f"the system up all along): {was} then {r['img_s']:,.0f} img/s."
            )
    return ["", *out] if out else []


def peaks(rows: list[dict]) -> dict[str, float]:
    """Each system's best img/s over its rows, in the order the systems first appear."""
    peak: dict[str, float] = {}
    for r in rows:
        peak[r["system"]] = max(peak.get(r["system"], 0.0), r["img_s"])
    return peak


BREAKDOWN_KEYS = [
    "ingress",
    "preprocess",
    "queue",
    "gpu",
    "postprocess",
    "hops",
    "hop_in",
    "hop_out",
    "total",
]


def breakdown_table(bd: dict[str, dict]) -> list[str]:
    """Rows of ``"system@corpus@clients"`` -> mean ms per stage, ordered by clients."""
    lines = ["| clients | " + " | ".join(BREAKDOWN_KEYS) + " |"]
    lines.append("|" + "---|" * (len(BREAKDOWN_KEYS) + 1))
    for k in sorted(bd, key=lambda x: int(x.rsplit("@", 1)[1])):
        cells = " | ".join(f"{bd[k][x]:.1f}" if x in bd[k] else "-" for x in BREAKDOWN_KEYS)
        lines.append(f"| {k.rsplit('@', 1)[1]} | {cells} |")
    return lines


def level_table(rows: list[dict], clients: list[int], cell) -> list[str]:
    """One row per system, one column per client count; ``cell(row)`` fills a measured one."""
    by = {(r["system"], r["clients"]): r for r in rows}
    lines = ["| system | " + " | ".join(f"{c}" for c in clients) + " |"]
    lines.append("|" + "---|" * (len(clients) + 1))
    for s in dict.fromkeys(r["system"] for r in rows):
        cells = [cell(by[(s, c)]) if (s, c) in by else "not measured" for c in clients]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def gpu_cell(r: dict) -> str:
    """A level's device: a kernel running (NVML's utilisation) / the JPEG engines busy."""
    if r.get("gpu_util") is None:
        return "-"
    jpeg = r.get("gpu_jpeg_util")
    return f"{r['gpu_util']:.2f} / " + ("-" if jpeg is None else f"{jpeg:.2f}")


def gpu_lines(rows: list[dict], clients: list[int]) -> list[str]:
    """The device's busy fractions by system and level, where the rows sampled it."""
    if not any(r.get("gpu_util") is not None for r in rows):
        return []
    return [
        "",
        "The GPU during each level (`benchmarks/device_sampler.py`, NVML): the fraction of the "
        "time a kernel was running / the fraction the JPEG engines were busy ('-': not sampled):",
        "",
        *level_table(rows, clients, gpu_cell),
    ]


def run_cell(r: dict) -> str:
    part = ", part of the system (replicas starting)" if r.get("replicas_starting") else ""
    if not r["img_s"]:
        return "0 answered within the window" + part
    return (
        f"{r['img_s']:,.0f} ({r['p50_ms']:.0f} / {r['p99_ms']:.0f})"
        + (f", {r['errors']} err" if r["errors"] else "")
        + part
    )


def goals_of(rows: list[dict], corpus: str) -> list[str]:
    """The end-to-end goals (issue 28) that this corpus's rows can judge; the server CPU per
    image at the peak where the rows have it."""
    peak = peaks(rows)
    f = {r["clients"]: r for r in rows if r["system"] == "ferry"}
    out = []
    goal = 10_000 if corpus == "chelsea" else 7_000
    out.append(f"* Ferry's peak: {peak['ferry']:,.0f} img/s (goal >= {goal:,}).")
    top = max(f.values(), key=lambda r: r["img_s"])
    if top.get("server_cpu_ms_per_img"):
        out.append(
            f"* server CPU at the peak: {top['server_cpu_ms_per_img']:.2f} ms per image "
            "(goal <= 1.0)."
        )
    expert = {s: v for s, v in peak.items() if s.startswith("rayserve_expert")}
    if expert:
        best = max(expert, key=expert.get)
        out.append(
            f"* vs the expert Ray Serve app at its best replica count ({best}, {expert[best]:,.0f}): "
            f"{ratio_text(rows, best, peak)} (goal >= 1.5x, against a strong peer)."
        )
    if 256 in f:
        out.append(f"* p99 at 256 clients: {f[256]['p99_ms']:.0f} ms (goal <= 60 ms).")
    if 1 in f:
        out.append(f"* p50 at one client: {f[1]['p50_ms']:.1f} ms (goal <= 4 ms).")
    if 1024 in f:
        out.append(
            f"* at 1,024 clients: {f[1024]['img_s'] / peak['ferry'] * 100:.0f}% of the peak, "
            f"{f[1024]['errors']} errors (goal >= 95%, none)."
        )
    return out


def e2e_section(e2e: dict) -> list[str]:
    rows = firsts(e2e["rows"])
    lines = [f"Machine: {e2e['machine']}; {e2e['date']}. Method: {e2e['method']}.", ""]
    lines += [f"* corpus `{k}`: {v}." for k, v in e2e["corpora"].items()]
    lines += [f"* {k}: {v}." for k, v in e2e.get("runs", {}).items()]
    gpus = {r.get("run"): r["gpu"] for r in rows if r.get("gpu")}
    if len(set(gpus.values())) > 1:  # the file's machine line is its last run's
        by = ", ".join(
            f"{k} on {v}" for k, v in sorted(gpus.items(), key=lambda kv: run_no(str(kv[0])))
        )
        lines += [f"* The runs' devices differ ({by}): compare rows of one device only."]
    bd = e2e.get("ferry_breakdown", {})
    for corpus in e2e["corpora"]:
        part = [r for r in rows if r["corpus"] == corpus]
        if not part:
            continue
        clients = sorted({r["clients"] for r in part})
        peak = peaks(settled(part))
        lines += [
            "",
            f"### Corpus `{corpus}`",
            "",
            "img/s (p50 / p99 ms) by concurrent clients:",
            "",
        ]
        lines += level_table(part, clients, run_cell)
        lines += repeat_lines([r for r in e2e["rows"] if r["corpus"] == corpus])
        if any(r.get("workload") == "image" for r in part):
            lines += image_lines(part, bd, corpus)
        if "ferry" in peak:
            lines += ["", "| system | peak img/s | Ferry / system |", "|---|---|---|"]
            lines += [f"| {s} | {v:,.0f} | {ratio_text(part, s, peak)} |" for s, v in peak.items()]
            lines += ["", "Against the goals:", "", *goals_of(settled(part), corpus)]
        cpu = max(max(r.get("loadgen_cpu_per_proc") or [0]) for r in part)
        lines += [
            "",
            f"Load generator: its busiest process used at most {cpu:.2f} of a core (user+system "
            "per wall second) in any row, so it was not the bottleneck.",
            "",
            "Busy CPU cores on the node during each level (every process: load generator, "
            "HAProxy, replicas):",
            "",
        ]
        lines += level_table(
            part,
            clients,
            lambda r: (
                "-" if r.get("machine_busy_cores") is None else f"{r['machine_busy_cores']:.1f}"
            ),
        )
        lines += gpu_lines(part, clients)
        lines += thread_lines(part)
        picks = {k: v for k, v in bd.items() if k.startswith(f"ferry@{corpus}@")}
        if picks:
            lines += [
                "",
                "Where a request's time goes in `ferry` (mean ms, from the answers' `timings_ms`): "
                "`ingress` is arrival to the group leaving the ingress (body, checks, coalescing), "
                "`queue` the wait for a GPU batch, `gpu` the batch from submission to its result "
                "on the host, `hops` what is left (HAProxy, the answer's way back, and Serve calls "
                "where a placement has them); `hop_in` and `hop_out` are the parts of `hops` "
                "before and after the inference stage.",
                "",
                *breakdown_table(picks),
            ]
    return lines
