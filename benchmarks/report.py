"""Write benchmarks/RESULTS.md from the JSON files in benchmarks/results/.

python benchmarks/report.py
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RES = os.path.join(HERE, "results")


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


RUN_COLS = [("img/s", "img_s"), ("p50 ms", "p50_ms"), ("p99 ms", "p99_ms"), ("errors", "errors")]
"""A load level's numbers, after whatever names the row."""


def notes_of(stem: str) -> list[str]:
    """``["", text]`` of results/{stem}_notes.md, to follow a section's tables; ``[]`` without one."""
    path = os.path.join(RES, f"{stem}_notes.md")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return ["", f.read().strip()]


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


def breakdown_table(bd: dict[str, dict], first: str) -> list[str]:
    """Rows of ``"system@clients"`` -> mean ms per stage, ordered by clients."""
    lines = [f"| {first} | " + " | ".join(BREAKDOWN_KEYS) + " |"]
    lines.append("|" + "---|" * (len(BREAKDOWN_KEYS) + 1))
    for k in sorted(bd, key=lambda x: int(x.split("@")[1])):
        cells = " | ".join(f"{bd[k][x]:.1f}" if x in bd[k] else "-" for x in BREAKDOWN_KEYS)
        lines.append(f"| {k.split('@')[1]} | {cells} |")
    return lines


def e2e_section(e2e: dict, goals: bool = True) -> list[str]:
    rows = e2e["rows"]
    systems = list(dict.fromkeys(r["system"] for r in rows))
    clients = sorted({r["clients"] for r in rows})
    by = {(r["system"], r["clients"]): r for r in rows}
    lines = [
        f"Machine: {e2e['machine']}; {e2e['date']}. Image: {e2e['image']}.",
        f"Method: {e2e['method']}.",
        "",
    ]
    for k, v in e2e.get("runs", {}).items():
        lines.append(f"* {k}: {v}.")
    lines += ["", "img/s (p50 / p99 ms) by concurrent clients:", ""]
    head = "| system | " + " | ".join(f"{c} clients" for c in clients) + " |"
    lines += [head, "|" + "---|" * (len(clients) + 1)]
    for s in systems:
        cells = []
        for c in clients:
            r = by.get((s, c))
            if r is None:
                cells.append("not measured")
            elif not r["img_s"]:
                cells.append("0 answered within the window")
            else:
                cells.append(
                    f"{r['img_s']:,.0f} ({r['p50_ms']:.0f} / {r['p99_ms']:.0f})"
                    + (f", {r['errors']} err" if r["errors"] else "")
                )
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    peak = peaks(rows)
    if "ferry" in peak and goals:
        lines += [
            "",
            "Peak throughput and Ferry's ratio to each system (same machine, the two runs above):",
            "",
        ]
        lines += ["| system | peak img/s | Ferry / system |", "|---|---|---|"]
        for s in systems:
            lines.append(f"| {s} | {peak[s]:,.0f} | {peak['ferry'] / peak[s]:.2f}x |")
        f = {c: by[("ferry", c)] for c in clients if ("ferry", c) in by}
        goals = []
        goals.append(f"* Ferry peak {peak['ferry']:,.0f} img/s (goal >= 5,000).")
        defaults = [s for s in ("rayserve_batch_1rep", "rayserve_batch_4rep") if s in peak]
        if defaults:
            best_def = max(peak[s] for s in defaults)
            goals.append(
                f"* vs the usual app on Ray Serve's defaults (best of 1 and 4 replicas, {best_def:,.0f}): "
                f"{peak['ferry'] / best_def:.1f}x (goal >= 25x)."
            )
        strong = [s for s in peak if "haproxy" in s]
        if strong:
            best = max(peak[s] for s in strong)
            goals.append(
                f"* vs its strongest form (HAProxy, best replica count, {best:,.0f}): "
                f"{peak['ferry'] / best:.1f}x (goal >= 3x)."
            )
        if 256 in f:
            goals.append(f"* p99 at 256 clients: {f[256]['p99_ms']:.0f} ms (goal <= 100 ms).")
        if 512 in f:
            goals.append(
                f"* at 512 clients: {f[512]['img_s'] / peak['ferry'] * 100:.0f}% of the peak (goal >= 95%)."
            )
        if 1 in f:
            goals.append(f"* p50 at one client: {f[1]['p50_ms']:.1f} ms (goal <= 8 ms).")
        lines += ["", "Against the goals:", ""] + goals
    cpu = [max(r.get("loadgen_cpu_per_proc") or [0]) for r in rows]
    if cpu:
        lines += [
            "",
            f"Load generator: its busiest process used at most {max(cpu):.2f} of a core (user+system "
            "per wall second) in any row, so it was not the bottleneck.",
        ]
    busy = [r for r in rows if r.get("machine_busy_cores") is not None]
    if busy:
        lines += [
            "",
            "Busy CPU cores on the node during each level (every process: load generator, HAProxy, "
            "replicas; of 16):",
            "",
            "| system | " + " | ".join(f"{c}" for c in clients) + " |",
            "|" + "---|" * (len(clients) + 1),
        ]
        for s in systems:
            cells = [
                f"{by[(s, c)]['machine_busy_cores']:.1f}"
                if (s, c) in by and by[(s, c)].get("machine_busy_cores") is not None
                else "-"
                for c in clients
            ]
            lines.append(f"| {s} | " + " | ".join(cells) + " |")
    bd = e2e.get("ferry_breakdown", {})
    picks = [k for k in bd if k.startswith("ferry@")]
    if not picks:  # runs of other Ferry forms: a table per form
        picks = list(bd)
    if picks:
        lines += [
            "",
            "Where a request's time goes in Ferry (mean ms, from the answers' `timings_ms`): `ingress` is "
            "arrival to the group leaving the ingress (body, checks, coalescing), `queue` the wait for a GPU "
            "batch, `gpu` the batch from submission to its result on the host, `hops` what is left: Serve "
            "calls and transfers between stages, HAProxy, the answer's way back; where the inference replica "
            "answers, `hop_in` and `hop_out` are the parts of `hops` spent on the Serve call to it and on "
            "the way back.",
            "",
        ]
        for system in dict.fromkeys(k.split("@")[0] for k in picks):
            if system != "ferry":
                lines += [f"`{system}`:", ""]
            lines += breakdown_table(
                {k: bd[k] for k in picks if k.split("@")[0] == system}, "clients"
            )
            lines.append("")
    prof = e2e.get("profile_512")
    if prof:
        cpu = ", ".join(
            f"{k.replace('ServeReplica:ferry:', '')} {v:.2f}"
            for k, v in prof["cpu_ms_per_request"].items()
            if v >= 0.01
        )
        lines += [
            f"Profile: {prof['what']}. {prof['load']['img_s']:,.0f} img/s; CPU ms per request: {cpu} "
            f"(total {prof['cpu_ms_per_request_total']:.2f}); the node's busy cores "
            f"{prof['machine_busy_cores']:.1f} of {prof['machine_cores']}.",
        ]
    return lines


def fused_section(e2e: dict) -> list[str]:
    rows = e2e["rows"]
    lines = [
        f"Machine: {e2e['machine']}; {e2e['date']}. Image: {e2e['image']}. One run, 20 s per "
        "level; `ferry_fused` is `benchmarks/configs/ferry_e2e_fused.yaml` (decode in 9 ingress "
        "replicas, answers from the inference replica: one Serve hop per call instead of three).",
        "",
        md_table(rows, [("system", "system"), ("clients", "clients"), *RUN_COLS]),
    ]
    peak = peaks(rows)
    if len(peak) == 2:
        a, b = list(peak)
        lines += [
            "",
            f"Peak: {a} {peak[a]:,.0f}, {b} {peak[b]:,.0f} img/s: {peak[a] / peak[b]:.2f}x.",
        ]
    bd = e2e.get("ferry_breakdown", {})
    if bd:
        lines += ["", *breakdown_table(bd, "ferry_fused clients")]
    lines += notes_of("e2e_fused")
    return lines


def gpu_decode_section(e2e: dict) -> list[str]:
    """The GPU-decode pipeline end to end, from its own runs (e2e_gpu_decode.json)."""
    rows = e2e["rows"]
    lines = [
        f"Machine: {e2e['machine']}; {e2e['date']}. Image: {e2e['image']}. Method: "
        f"{e2e['method']}.",
        "",
    ]
    for k, v in e2e.get("runs", {}).items():
        lines.append(f"* run {k}: {v}.")
    if e2e.get("not_measured"):
        lines.append(f"* Not measured: {e2e['not_measured']}.")
    lines += [
        "",
        md_table(rows, [("system", "system"), ("run", "run"), ("clients", "clients"), *RUN_COLS]),
        "",
    ]
    peak = peaks(rows)
    if "ferry_gpu_decode" in peak:
        f = peak["ferry_gpu_decode"]
        ratios = ", ".join(
            f"{s} {v:,.0f} ({f / v:.2f}x)" for s, v in peak.items() if s != "ferry_gpu_decode"
        )
        lines += [f"Peak img/s: ferry_gpu_decode {f:,.0f}; ferry_gpu_decode / {ratios}.", ""]
    bd = e2e.get("ferry_breakdown", {})
    for system in dict.fromkeys(k.split("@")[0] for k in bd):
        part = {k: v for k, v in bd.items() if k.startswith(system + "@")}
        lines += [*breakdown_table(part, f"{system} clients"), ""]
    return lines


def decode_section(dec: dict) -> list[str]:
    lines = [
        f"{dec['machine']}; {dec['date']}. Image: {dec['image']}. {dec['method']}."
        + (f" Code: {dec['code']}." if dec.get("code") else ""),
        "",
        md_table(
            dec["rows"],
            [
                ("path", "path"),
                ("img/s", "img_s"),
                ("CPU ms / img", "cpu_ms_per_img"),
                ("img/s vs 1 CPU thread", "img_s_vs_cpu_1t"),
                ("CPU ms vs 1 CPU thread", "cpu_ms_vs_cpu_1t"),
            ],
        ),
    ]
    return lines


def profile_inference_section(prof: dict) -> list[str]:
    def rows_of(rs: list[dict]) -> list[dict]:
        out = []
        for r in rs:
            d = {k: r[k] for k in ("group", "img_s", "cpu_ms_per_img", "event_loop_ms_per_img")}
            d["event_loop_busy"] = f"{r['event_loop_busy']:.0%}"
            out.append(d)
        return out

    cols = [
        ("images per call", "group"),
        ("img/s", "img_s"),
        ("process CPU ms / img", "cpu_ms_per_img"),
        ("event loop ms / img", "event_loop_ms_per_img"),
        ("event loop busy", "event_loop_busy"),
    ]
    lines = [f"{prof['machine']}; {prof['date']}. {prof['method']}.", ""]
    for key, label in (("first", "first"), ("earlier", "then"), (None, "as committed")):
        part = prof if key is None else prof.get(key)
        if not part:
            continue
        lines += [f"{label}, {part['code']}:", "", md_table(rows_of(part["rows"]), cols), ""]
    return lines


def profile_pairs_section(doc: dict) -> list[str]:
    """profile_pipeline.py results saved with --out/--label: one row per label."""
    rows = [
        {
            "label": label,
            **r["load"],  # clients, img_s, p50_ms, p99_ms, errors
            "cpu": r["cpu_ms_per_request_total"],
            "ingress_cpu": r["cpu_ms_per_request"].get("ServeReplica:ferry:Ingress", 0.0),
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
        ("of it in the ingress", "ingress_cpu"),
        ("errors", "errors"),
    ]
    out = [f"{doc['machine']}; {doc['date']}. {doc.get('method', '')}", "", md_table(rows, cols)]
    return out + ["", doc["summary"]] if doc.get("summary") else out


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


def run_section(stem: str, title: str, body: list[str]) -> list[str]:
    """A section of end-to-end runs: its table, then results/{stem}.png and {stem}_notes.md."""
    while body and not body[-1]:
        body = body[:-1]
    out = [f"## {title}", "", *body, "", f"![{stem}](results/{stem}.png)", ""]
    notes = notes_of(stem)
    if notes:
        out += [*notes[1:], ""]
    return out


def main() -> int:
    out = [
        "# Benchmark results",
        "",
        "Regenerate with `python benchmarks/report.py`; the numbers come from "
        "`benchmarks/results/*.json`, each written by the benchmark named in its section, on the machine it names.",
        "",
    ]
    e2e = load("e2e.json")
    if e2e:
        out += run_section("e2e", "End to end over HTTP (`bench_e2e.py`)", e2e_section(e2e))
    for stem, title in (  # earlier runs and forms: their tables, without the goals
        ("e2e_onehop", "How `ferry` became one deployment: the diagnostic run"),
        (
            "e2e_split",
            "The previous session's run: `ferry` in the split form, 6 ingress and 4 inference replicas",
        ),
        ("e2e_diag", "How the split form got its replica counts: the diagnostic run"),
        (
            "e2e_2inf",
            "An earlier run: the split form with 10 ingress and 2 inference replicas",
        ),
        ("e2e_earlier", "Earlier end to end: four deployments, JPEGs decoded on CPU threads"),
    ):
        doc = load(f"{stem}.json")
        if doc:
            out += run_section(stem, f"{title} (`{stem}.json`)", e2e_section(doc, goals=False))
    fused = load("e2e_fused.json")
    if fused:
        out += [
            "## Fused stages, end to end (`bench_e2e.py --systems ferry_fused,...`)",
            "",
            *fused_section(fused),
            "",
        ]
    gd = load("e2e_gpu_decode.json")
    if gd:
        out += run_section(
            "e2e_gpu_decode",
            "JPEG decode on the GPU, end to end: the runs that led to `ferry` (`e2e_gpu_decode.json`)",
            gpu_decode_section(gd),
        )
    dec = load("decode.json")
    if dec:
        out += ["## Decode and resize, one process (`bench_decode.py`)", "", *decode_section(dec)]
        out += [""]
    prof = load("profile_inference.json")
    if prof:
        out += [
            "## The inference replica alone (`profile_inference.py`)",
            "",
            *profile_inference_section(prof),
        ]
    for name, title in (
        ("profile_coalesce.json", "The ingress's in-flight bound"),
        ("profile_dispatch_idle.json", "Ingress groups leave at once when idle"),
        ("profile_fastpath.json", "POST classify past FastAPI"),
        ("profile_throughput_mode.json", "Serve's throughput-optimized mode"),
        ("profile_switch_interval.json", "A shorter GIL switch interval in the replicas"),
        ("profile_one_process.json", "The whole pipeline in the ingress replica"),
        ("profile_metrics_buffer.json", "Metrics handed to Ray from their own thread"),
        ("profile_jpeg_header.json", "A JPEG's size read in Python on the event loop"),
    ):
        doc = load(name)
        if doc:
            out += [f"## {title} (`profile_pipeline.py`)", "", *profile_pairs_section(doc), ""]
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
    sc = load("serve_check.json")
    if sc:
        a, b = sc["clients_64_30s"], sc["clients_256_15s"]
        out += [
            "## Serving check (issue 4)",
            "",
            f"{sc['config']}; {sc['image']}; {sc['load_generator']}.",
            "",
            f"* 64 clients, 30 s: {a['img_s']:,.0f} img/s, p50 {a['p50_ms']:.0f} ms, p99 {a['p99_ms']:.0f} ms, {a['errors']} errors.",
            f"* 256 clients, 15 s: {b['img_s']:,.0f} img/s, p50 {b['p50_ms']:.0f} ms, p99 {b['p99_ms']:.0f} ms, {b['errors']} errors.",
            f"* one client: {sc['one_client_response']['timings_ms']}",
            "",
        ]
    with open(os.path.join(HERE, "RESULTS.md"), "w") as f:
        f.write("\n".join(out))
    print(os.path.join(HERE, "RESULTS.md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
