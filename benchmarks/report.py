"""Write benchmarks/RESULTS.md from the JSON files in benchmarks/results/: a headline table
of the current figures -- each with the commit and date it was measured at, and whether the
code it measures has changed since -- then one section per benchmark, its current result
only (earlier runs are in git history).

python benchmarks/report.py
"""

from __future__ import annotations

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.path.join(HERE, "results")
sys.path.insert(0, os.path.dirname(HERE))

from benchmarks.common import run_no  # noqa: E402
from benchmarks.report_image import image_lines  # noqa: E402
from benchmarks.report_threads import thread_lines  # noqa: E402


def load(name: str) -> dict | None:
    p = os.path.join(RES, name)
    return json.load(open(p)) if os.path.exists(p) else None


def md_table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    out = ["| " + " | ".join(h for h, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for _, k in cols:
            v = r.get(k, "")
            if isinstance(v, float):
                cells.append(f"{v:,.1f}" if abs(v) >= 10 or v == 0 else f"{v:.3g}")
            else:
                cells.append(str(v))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def notes_of(stem: str) -> list[str]:
    """``["", text]`` of results/{stem}_notes.md, to follow a section's tables; ``[]`` without one."""
    path = os.path.join(RES, f"{stem}_notes.md")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return ["", f.read().strip()]


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


def run_cell(r: dict) -> str:
    if not r["img_s"]:
        return "0 answered within the window"
    return f"{r['img_s']:,.0f} ({r['p50_ms']:.0f} / {r['p99_ms']:.0f})" + (
        f", {r['errors']} err" if r["errors"] else ""
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
    rows = e2e["rows"]
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
        peak = peaks(part)
        lines += [
            "",
            f"### Corpus `{corpus}`",
            "",
            "img/s (p50 / p99 ms) by concurrent clients:",
            "",
        ]
        lines += level_table(part, clients, run_cell)
        if any(r.get("workload") == "image" for r in part):
            lines += image_lines(part, bd, corpus)
        if "ferry" in peak:
            lines += ["", "| system | peak img/s | Ferry / system |", "|---|---|---|"]
            lines += [f"| {s} | {v:,.0f} | {ratio_text(part, s, peak)} |" for s, v in peak.items()]
            lines += ["", "Against the goals:", "", *goals_of(part, corpus)]
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


def decode_section(dec: dict) -> list[str]:
    lines = [
        f"{dec['machine']}; {dec['date']}. Image: {dec['image']}. {dec['method']}."
        + (f" Code: {dec['code']}." if dec.get("code") else ""),
        "",
        md_table(
            dec["rows"],
            [
                *(
                    [("corpus", "corpus"), ("images a call", "batch")]
                    if "batch" in dec["rows"][0]
                    else []
                ),
                ("path", "path"),
                ("img/s", "img_s"),
                ("CPU ms / img", "cpu_ms_per_img"),
                ("img/s vs 1 CPU thread", "img_s_vs_cpu_1t"),
                ("CPU ms vs 1 CPU thread", "cpu_ms_vs_cpu_1t"),
                *(
                    [("img/s vs the peer", "img_s_vs_peer")]
                    if any("img_s_vs_peer" in r for r in dec["rows"])
                    else []
                ),
            ],
        ),
    ]
    return lines


def profile_inference_section(prof: dict) -> list[str]:
    rows = []
    for r in prof["rows"]:
        d = {k: r[k] for k in ("group", "img_s", "cpu_ms_per_img", "event_loop_ms_per_img")}
        d["event_loop_busy"] = f"{r['event_loop_busy']:.0%}"
        rows.append(d)
    cols = [
        ("images per call", "group"),
        ("img/s", "img_s"),
        ("process CPU ms / img", "cpu_ms_per_img"),
        ("event loop ms / img", "event_loop_ms_per_img"),
        ("event loop busy", "event_loop_busy"),
    ]
    return [
        f"{prof['machine']}; {prof['date']}. {prof['method']}; {prof['code']}.",
        "",
        md_table(rows, cols),
    ]


def profile_pairs_section(doc: dict) -> list[str]:
    """profile_pipeline.py results saved with --out/--label: one row per label."""
    rows = [
        {
            "label": label,
            **r["load"],  # clients, img_s, p50_ms, p99_ms, errors
            "cpu": r["cpu_ms_per_request_total"],
            "ingress_cpu": r["cpu_ms_per_request"].get(  # (--bare: the floor app's one replica)
                "ServeReplica:ferry:Ingress",
                r["cpu_ms_per_request"].get("ServeReplica:ferry:Floor", 0.0),
            ),
        }
        for label, r in doc["results"].items()
    ]
    cols = [
        ("run", "label"),
        ("clients", "clients"),
        ("img/s", "img_s"),
        ("p50 ms", "p50_ms"),
        ("p99 ms", "p99_ms"),
        ("CPU ms / request", "cpu"),
        ("of it in the ingress (--bare: its replica)", "ingress_cpu"),
        ("errors", "errors"),
    ]
    out = [f"{doc['machine']}; {doc['date']}. {doc.get('method', '')}", "", md_table(rows, cols)]
    return out + ["", doc["summary"]] if doc.get("summary") else out


def profile_pipeline_section(doc: dict) -> list[str]:
    """profile_pipeline.json: one experiment per A/B change, each run one row."""
    lines = []
    for exp in doc["experiments"].values():
        lines += [f"### {exp['title']}", "", *profile_pairs_section(exp), ""]
    return lines


def serve_hop_section(doc: dict) -> list[str]:
    """bench_serve_hop.py: one Serve call between replicas against a plain Ray actor call."""
    cols = [
        ("mode", "mode"),
        ("path", "path"),
        ("payload bytes", "payload_bytes"),
        ("there p50 ms", "hop_in_p50_ms"),
        ("back p50 ms", "hop_out_p50_ms"),
        ("round trip p50 ms", "round_trip_p50_ms"),
        ("p99 ms", "round_trip_p99_ms"),
        ("vs Ray actor", "vs_ray_actor"),
    ]
    lines = [f"{doc['machine']}; {doc['date']}. {doc['method']}.", "", md_table(doc["rows"], cols)]
    lines += notes_of("serve_hop")
    return lines


def transport_section(tr: dict) -> list[str]:
    lines = [f"{tr['machine']}; {tr['date']}. {tr['method']}.", ""]
    mb = 1 << 20
    rows = [{**r, "MB": r["bytes"] // mb} for r in tr["rows"]]
    for r in rows:
        r["gb_s_1"] = r.get("gb_s_one_envelope_per_call", "")
    lines.append(
        md_table(
            rows,
            [
                ("path", "path"),
                ("MB", "MB"),
                ("GB/s", "gb_s"),
                ("GB/s, 1 envelope a call", "gb_s_1"),
                ("p50 us", "p50_us"),
                ("p99 us", "p99_us"),
            ],
        )
    )
    lines += [
        "",
        "| MB | Ferry NCCL / raw NCCL | Ferry NCCL / object store | Ferry NCCL socket / object store |",
    ]
    lines.append("|---|---|---|---|")
    for r in tr["ratios"]:
        lines.append(
            f"| {r['bytes'] // mb} | {r['ferry_nccl_vs_raw']:.2f}x | "
            f"{r['ferry_nccl_vs_object_store']:.1f}x | {r['ferry_nccl_socket_vs_object_store']:.1f}x |"
        )
    lines += [
        "",
        "Goals: "
        + "; ".join(f"{k}: {'met' if v else 'missed'}" for k, v in tr["goals"].items())
        + ".",
    ]
    lines += notes_of("transport")
    return lines


def render() -> str:
    out = [
        "# Benchmark results",
        "",
        "Regenerate with `python benchmarks/report.py`; the numbers come from "
        "`benchmarks/results/*.json`, each written by the benchmark named in its section, on the "
        "machine it names. One section per benchmark, its current result; earlier and "
        "superseded runs are in git history (`git log -- benchmarks/results`). How to run each: "
        "[README.md](README.md).",
        "",
        *headline_section(),
    ]
    e2e = load("e2e.json")
    if e2e:
        out += ["## End to end over HTTP (`bench_e2e.py`)", "", *e2e_section(e2e), ""]
        out += ["![e2e](results/e2e.png)", ""]
        out += [*notes_of("e2e")[1:], ""]
    dec = load("decode.json")
    if dec:
        out += ["## Decode and resize, one process (`bench_decode.py`)", "", *decode_section(dec)]
        out += [""]
    prof = load("profile_inference.json")
    if prof:
        out += [
            "## The inference stage alone (`profile_inference.py`)",
            "",
            *profile_inference_section(prof),
            "",
        ]
    pp = load("profile_pipeline.json")
    if pp:
        out += [
            "## Where the CPU goes, A/B on two cores (`profile_pipeline.py`)",
            "",
            *profile_pipeline_section(pp),
        ]
    hop = load("serve_hop.json")
    if hop:
        out += [
            "## One Serve call between replicas (`bench_serve_hop.py`)",
            "",
            *serve_hop_section(hop),
            "",
        ]
    tr = load("transport.json")
    if tr:
        out += [
            "## Tensors between two GPUs (`bench_transport.py`)",
            "",
            *transport_section(tr),
            "",
        ]
    eng = load("engine.json")
    if eng:
        out += [
            "## ResNet-50 engine (`bench_engine.py`)",
            "",
            f"{eng['machine']}; {eng['date']}. {eng['baselines']}.",
            "",
            md_table(
                eng["rows"],
                [
                    ("batch", "batch"),
                    ("Ferry img/s", "ferry_img_s"),
                    ("Ferry naive", "ferry_naive_img_s"),
                    ("torch eager", "torch_eager_img_s"),
                    ("torch CUDA graph", "torch_graph_img_s"),
                    ("Ferry / eager", "vs_torch_eager"),
                    ("Ferry / graph", "vs_torch_graph"),
                ],
            ),
            "",
        ]
    conv = load("conv.json")
    if conv:
        out += [
            "## conv2d against cuDNN (`bench_conv.py`)",
            "",
            f"{conv['machine']}; {conv['date']}. {conv['method']}.",
            "",
        ]
        for b, s in sorted(conv["whole_network"].items(), key=lambda kv: int(kv[0])):
            out.append(
                f"* batch {b}: all ResNet-50 convolutions {s['all_convs_ferry_us'] / 1e3:.2f} ms in Ferry, "
                f"{s['all_convs_cudnn_us'] / 1e3:.2f} ms in cuDNN: {s['vs_cudnn']:.2f}x cuDNN's speed."
            )
        worst = sorted(conv["rows"], key=lambda r: r["vs_cudnn"])[:5]
        out += [
            "",
            "Slowest relative to cuDNN:",
            "",
            md_table(
                worst,
                [
                    ("batch", "batch"),
                    ("layer", "layer"),
                    ("shape", "shape"),
                    ("path", "path"),
                    ("Ferry us", "ferry_us"),
                    ("cuDNN us", "cudnn_us"),
                    ("x cuDNN", "vs_cudnn"),
                ],
            ),
            "",
        ]
    alloc = load("alloc.json")
    if alloc:
        out += [
            "## Device pool against cudaMalloc/cudaFree (`bench_alloc.py`)",
            "",
            f"{alloc['machine']}; {alloc['date']}. 12 MB blocks, {alloc['load']}.",
            "",
            md_table(
                alloc["rows"],
                [
                    ("threads", "threads"),
                    ("mode", "mode"),
                    ("ops/s", "ops_per_s"),
                    ("p50 us", "p50_us"),
                    ("p99 us", "p99_us"),
                ],
            ),
            "",
        ]
    lg = load("loadgen.json")
    if lg:
        out += [
            "## The load generators (`bench_loadgen.py`)",
            "",
            f"{lg['machine']}; {lg['date']}. {lg['method']}.",
            "",
            md_table(
                lg["rows"],
                [
                    ("generator", "generator"),
                    ("req/s", "req_s"),
                    ("CPU ms / request", "cpu_ms_per_request"),
                ],
            ),
            "",
            f"locust costs {lg['locust_cpu_per_request_vs_loadgen']:.2f}x loadgen's CPU per request.",
            "",
        ]
    models = load("models.json")
    if models:
        out += ["## Your own models: torch engine and peers (`bench_models.py`)", ""]
        out += [*models_section(models), ""]
    rel = load("reliability.json")
    if rel:
        out += ["## Reliability (`reliability.py`)", "", *reliability_section(rel), ""]
        sys.path.insert(0, os.path.dirname(HERE))  # (run as a script: benchmarks importable)
        from benchmarks import overload

        for key, title in (("overload", "Overload"), ("overload_gpu", "Overload on the GPU")):
            if key in rel:
                out += [f"### {title} (`overload.py`)", "", *overload.section(rel[key]), ""]
        if "soak" in rel:
            from benchmarks import soak

            out += ["### Soak (`soak.py`)", "", *soak.section(rel["soak"]), ""]
    pa = load("perf_analyzer.json")
    if pa:
        out += [
            "## Triton's perf_analyzer over HTTP and gRPC, beside loadgen (`bench_perf_analyzer.py`)",
            "",
        ]
        out += perf_analyzer_sections(pa)
    return "\n".join(out)


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


def _e2e(doc: dict) -> list[tuple[str, str]]:
    out = []
    for corpus in ("chelsea", "photos"):
        rows = [r for r in doc["rows"] if r["corpus"] == corpus]
        if not rows:
            continue
        peak = peaks(rows)
        f = {r["clients"]: r for r in rows if r["system"] == "ferry"}
        top = max(f.values(), key=lambda r: r["img_s"])
        cpu = top.get("server_cpu_ms_per_img")
        runs = doc.get("runs", {})
        older = top.get("run") and top["run"] != max(runs, key=run_no, default=None)
        at = re.search(r"commit ([0-9a-f]{7})", runs.get(top.get("run"), "")) if older else None
        out.append(
            (
                f"Ferry end to end, peak img/s ({corpus} JPEG, HTTP; server CPU ms per image)",
                f"{peak['ferry']:,.0f} at {top['clients']} clients"
                + (f" ({cpu:.1f} ms)" if cpu else "")
                + (f", from {top['run']} at {at.group(1)}" if at else ""),
            )
        )
        peers = {s: v for s, v in peak.items() if s.startswith("rayserve")}
        if peers:
            best = max(peers, key=peers.get)
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
                )
            )
        lat = [f"p99 {f[256]['p99_ms']:.0f} ms at 256 clients"] if 256 in f else []
        lat += [f"p50 {f[1]['p50_ms']:.1f} ms at one client"] if 1 in f else []
        if lat:
            out.append((f"latency ({corpus})", ", ".join(lat)))
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
        for figure, value in rows_of(part):
            lines.append(f"| {figure} | {value} | {commit}, {date} | {machine.strip()} | {since} |")
    return lines + [""]


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
        + " | total |",
        "|---|---|" + "---|" * (len(procs) + 1),
    ]
    for r in prof["rows"]:
        c = r["cpu_ms_per_request"]
        total = sum(v for v in c.values() if v > 0)
        lines.append(
            f"| {r['protocol']} | {r.get('pa_infer_s', 'failed')} | "
            + " | ".join(f"{c.get(p, 0.0):.3f}" for p in procs)
            + f" | {total:.2f} |"
        )
    return lines


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


def reliability_section(rel: dict) -> list[str]:
    """reliability.json: one pathological image's cost; 1,000 stalled uploads."""
    sc, slow = rel["strip_cost"], rel["slow_clients"]
    cols = [
        ("image", "image"),
        ("decode ms", "decode_ms"),
        ("peak RSS growth MB", "peak_rss_growth_mb"),
    ]
    st = ", ".join(f"{v} x {k}" for k, v in slow["statuses"].items())
    return [
        f"{rel['machine']}; {rel['date']}.",
        "",
        f"Bounded decode: {sc['method']}.",
        "",
        md_table(sc["rows"], cols),
        "",
        f"Slow clients: {slow['method']}. The stalled uploads got {st}, all "
        f"{slow['closed']} connections closed by the server, the refusals' p99 "
        f"{slow['refused_503_p99_s']} s; the worst health answer took "
        f"{slow['probe_worst_s']['health']} s and the worst classify "
        f"{slow['probe_worst_s']['classify']} s ({slow['probes']['health']} of each, all 200).",
        *chaos_lines(rel),
        *([""] + [f"Not measured yet: {rel['not_measured']}."] if rel.get("not_measured") else []),
    ]


def chaos_lines(rel: dict) -> list[str]:
    """reliability_chaos.py's sections: replicas killed under load; redeploy and shutdown."""
    out = []
    for key in ("", "_one_process", "_gpu"):
        ch, dr = rel.get(f"chaos{key}"), rel.get(f"drain{key}")
        if ch:
            out += [
                "",
                f"Chaos ({ch['machine']}, {ch['config']}): {ch['method']} {len(ch['kills_at_s'])} "
                f"kills of {ch['killed']} in {ch['duration_s']} s, {ch['clients']} clients: "
                f"{ch['succeeded']:,} of {ch['requests']:,} succeeded ({ch['success_rate']:.3%}), "
                f"{ch['retried']} retried, {ch['hung_past_deadline']} past the deadline "
                f"(worst {ch['worst_s']} s); final statuses {ch['final_statuses']}"
                + (f", the failures {ch['failed_as']}." if ch.get("failed_as") else "."),
                *([f"Note: {ch['note']}"] if ch.get("note") else []),
            ]
        if dr and dr.get("method"):
            req = f" Requests: {dr['requests']}." if dr.get("requests") else ""
            out += ["", f"Drain ({dr.get('date')}): {dr['method']}{req}"]
        for phase, d in (dr or {}).items():
            if not isinstance(d, dict):  # (its date and method)
                continue
            how = f": {d['dropped_as']}" if d.get("dropped_as") else ""
            out += [
                "",
                f"Drain on {phase}: {d['in_flight_at_start']} requests in flight when it began, "
                f"{d['in_flight_finished_200']} finished with 200, {d['dropped']} dropped{how} "
                f"(took {d['took_s']} s; started meanwhile: {d['started_during']['final_statuses']}).",
            ]
    return out


def models_section(doc: dict) -> list[str]:
    """img/s per model and batch, one column per system, and ferry_torch's and ferry_onnx's
    ratios to torch_compile."""
    systems = [
        "ferry_torch",
        "torch_compile",
        "torch_eager",
        "ferry_native",
        "ferry_onnx",
        "ferry_onnx_native",
    ]
    cells: dict[tuple, dict] = {}
    for r in doc["rows"]:
        cells.setdefault((r["model"], r["batch"]), {})[r["system"]] = r
    present = [s for s in systems if any(s in c for c in cells.values())]
    rows = []
    for (model, batch), c in cells.items():
        row = {"model": model, "batch": batch}
        for s in present:
            r = c.get(s)
            row[s] = "" if r is None else f"{r['img_s']:,.0f} ({r['top1_agree']:.2f})"
        tc = c.get("torch_compile")
        for s in ("ferry_torch", "ferry_onnx"):
            r = c.get(s)
            row[f"{s}_ratio"] = f"{r['img_s'] / tc['img_s']:.2f}x" if r and tc else ""
        rows.append(row)
    cols = [("model", "model"), ("batch", "batch"), *((s, s) for s in present)]
    ratios = [(f"{s} / torch_compile", f"{s}_ratio") for s in ("ferry_torch", "ferry_onnx")]
    notes = [f"* {n}" for n in ([doc["notes"]] if isinstance(doc.get("notes"), str) else [])]
    return [
        f"{doc['machine']}; {doc['date']}"
        + (f", commit {doc['commit']}" if doc.get("commit") else "")
        + f". {doc['setup']}. Cells: img/s (top-1 agreement with torch fp32).",
        "",
        md_table(rows, [*cols, *ratios]),
        *([""] + notes if notes else []),
    ]


def main() -> int:
    path = os.path.join(HERE, "RESULTS.md")
    with open(path, "w") as f:
        f.write(render())
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
