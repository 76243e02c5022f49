"""Write benchmarks/RESULTS.md from the JSON files in benchmarks/results/: a headline table
of the current figures -- each with the commit and date it was measured at, and whether the
code it measures has changed since -- then one section per benchmark, its current result
only (earlier runs are in git history).

python benchmarks/report.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.report_base import HERE, load, md_table, notes_of  # noqa: E402
from benchmarks.report_e2e import e2e_section  # noqa: E402
from benchmarks.report_headline import headline_section  # noqa: E402
from benchmarks.report_protocols import perf_analyzer_sections  # noqa: E402
from benchmarks.report_sections import (  # noqa: E402
    decode_section,
    models_section,
    profile_inference_section,
    profile_pipeline_section,
    reliability_section,
    serve_hop_section,
    transport_section,
)
from benchmarks.report_streams import streams_section  # noqa: E402


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
    live = load("streams.json")
    if live:
        out += ["## Live streams over WebSocket (`bench_streams.py`)", "", *streams_section(live)]
    dec = load("decode.json")
    if dec:
        out += ["## Decode and resize (`bench_decode.py`)", "", *decode_section(dec)]
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


def main() -> int:
    path = os.path.join(HERE, "RESULTS.md")
    with open(path, "w") as f:
        f.write(render())
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
