"""bench_e2e's systems and overrides, and report.py: what the benchmarks hand `serve run`
and write, checked without running them (no Ray cluster, no GPU)."""

from __future__ import annotations

import os
import re

import pytest
import yaml

from benchmarks import e2e_merge, report, report_base, report_e2e
from benchmarks.bench_e2e import SYSTEMS, apply_sets, parse_sets, row_name, serve_config
from benchmarks.common import run_no
from benchmarks.e2e_configs import url_of
from benchmarks.e2e_systems import SHIPPED
from pipeline.config import PipelineConfig

FERRY_SYSTEMS = {  # system -> (its ingress replicas, its inference replicas)
    "ferry": (8, None),  # the whole pipeline in the ingress replicas
    "ferry_split": (6, 4),  # over the local hop (a Unix socket), the default
    "ferry_split_serve": (6, 4),  # the same hop as a Serve call
    "ferry_hop2": (8, 2),  # 8 HTTP replicas, 2 GPU owners fed over the local hop
    "ferry_hop2_hw": (8, 2),  # the same, every JPEG on the hardware engines
    "ferry_4stage": (6, 1),
    "ferry_naive": (8, None),
    "ferry_sleep": (8, None),  # ferry with sleeping CUDA waits
    "ferry_torch": (8, None),  # ferry with ResNet-50 on the torch engine
    "ferry_kept": (8, None),  # ferry with kept arenas
    "ferry_torch_kept": (8, None),  # ferry_torch with kept arenas
    "ferry_image": (8, None),  # the image workload, in ferry's placement
    "ferry_image_sleep": (8, None),  # the same with sleeping CUDA waits
    "ferry_image_enc16": (8, None),  # ferry_image_sleep with 16 encoder threads a replica
    "ferry_t1": (8, None),  # ferry with 1 or 2 nvImageCodec threads a replica
    "ferry_t2": (8, None),
    "ferry_hw": (8, None),  # ferry on the hardware JPEG engines alone
    "ferry_hw60": (8, None),  # ferry, 60% of each decode call on the engines, the rest CUDA
    "ferry_overlap": (8, None),  # ferry with preprocess.overlap_rounds
    "ferry_prio": (8, None),  # ferry with the decode-and-fit streams at high priority
    "ferry_torch_prio": (8, None),  # the same with ResNet-50 on the torch engine
    "ferry_swi05": (8, None),  # ferry with a 0.5 ms GIL switch interval in its replicas
    "ferry_torch_swi05": (8, None),  # the same with ResNet-50 on the torch engine
    "ferry_noprime": (8, None),  # ferry with the decoder's first call of one JPEG
    "ferry_keep256": (8, None),  # ferry with the decoder's pool keeping 256 MiB mapped
    "ferry_4rep": (4, None),  # ferry in 4 replicas of a quarter of the GPU
    "ferry_r2": (8, None),  # ferry with two decode rounds at once a replica
    "ferry_torch_r2": (8, None),  # the same with ResNet-50 on the torch engine
    "ferry_torch_dyn": (8, None),  # that, ResNet-50 compiled once (compile: dynamic), ten buckets
    "ferry_torch_dyn_direct": (8, None),  # that, its load on Ferry's own listener (port 8080)
    "ferry_torch_hop2_direct": (8, 2),  # 8 HTTP replicas (own listener), 2 torch GPU owners
    "ferry_nowatch": (8, None),  # ferry, its requests with Serve's disconnect watch off
    "ferry_shipped": (8, None),  # serve_config.gpu.yaml as it ships
    "ferry_shipped_b1": (8, None),  # that, one batch in flight a replica, one decode round
}


def _served(system: str, sets: dict | None = None) -> dict:
    path = serve_config(system, SYSTEMS[system], sets)
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    finally:
        os.unlink(path)


def test_the_systems_are_ferrys_placements_and_the_peers():
    assert {s for s, v in SYSTEMS.items() if v["kind"] == "ferry"} == set(FERRY_SYSTEMS)
    peers = {s for s, v in SYSTEMS.items() if v["kind"] == "peer"}
    assert {"rayserve_expert_4", "rayserve_expert_8", "rayserve_expert_12"} <= peers
    assert {"rayserve_batch_1rep", "rayserve_batch_haproxy_8rep"} <= peers
    # the header A/B: each side of it the same system but for its requests' header
    for base in ("ferry", "rayserve_expert_8"):
        watched, unwatched = SYSTEMS[base], SYSTEMS[f"{base}_nowatch"]
        assert "headers" not in watched
        assert unwatched["headers"] == {"x-request-disconnect-disabled": "?1"}
        assert {k: v for k, v in unwatched.items() if k != "headers"} == watched
    # the listener A/B: the load goes to Ferry's own port where the system has one
    assert url_of(SYSTEMS["ferry_torch_dyn_direct"]).startswith("http://127.0.0.1:8080/v1/")
    assert url_of(SYSTEMS["ferry_torch_dyn"]).startswith("http://127.0.0.1:8000/v1/")
    assert url_of(SYSTEMS["ferry_torch_dyn"], {"ingress.direct_port": 9001}).startswith(
        "http://127.0.0.1:9001/v1/"
    )
    # (a set of the whole section too, as serve run gets it)
    assert url_of(SYSTEMS["ferry_torch_dyn"], {"ingress": {"direct_port": 9002}}).startswith(
        "http://127.0.0.1:9002/v1/"
    )
    assert url_of(SYSTEMS["rayserve_expert_8"]) == "http://127.0.0.1:8000/classify"


def test_the_shipped_system_serves_the_shipped_gpu_config_unchanged():
    """``ferry_shipped`` is serve_config.gpu.yaml as a user runs it, its load on the
    config's own listener: what the README quotes of the shipped form is measured."""
    with open(SHIPPED) as f:
        shipped = yaml.safe_load(f)
    assert _served("ferry_shipped") == shipped
    port = shipped["applications"][0]["args"]["config"]["ingress"]["direct_port"]
    assert (
        url_of(SYSTEMS["ferry_shipped"]) == f"http://127.0.0.1:{port}/v1/models/resnet50/classify"
    )
    # its one-batch variant: the same file but for the two keys it sets
    b1 = _served("ferry_shipped_b1")
    pipeline = shipped["applications"][0]["args"]["config"]
    pipeline["executor"]["max_in_flight"] = 1
    pipeline["preprocess"]["decode_rounds"] = 1
    assert b1 == shipped


@pytest.mark.parametrize("system", [s for s in FERRY_SYSTEMS if not s.startswith("ferry_shipped")])
def test_benchmark_serve_configs_validate(system):
    """Each Ferry system of bench_e2e.py, as the file it hands `serve run`."""
    from ray.serve.schema import ServeDeploySchema

    raw = _served(system)
    ServeDeploySchema.model_validate(raw)
    cfg = PipelineConfig.model_validate(raw["applications"][0]["args"]["config"])
    assert cfg.executor.backend == "cupy"
    assert (cfg.executor.mode == "naive") == (system == "ferry_naive")
    sleeps = system in ("ferry_sleep", "ferry_image_sleep", "ferry_image_enc16")
    assert cfg.executor.host_wait == ("sleep" if sleeps else "auto")
    assert cfg.preprocess.threads == {"ferry_t1": 1, "ferry_t2": 2}.get(system, 4)
    assert cfg.preprocess.encoder_threads == (16 if system == "ferry_image_enc16" else None)
    hw = system in ("ferry_hw", "ferry_hw60", "ferry_hop2_hw", "ferry_torch_hop2_direct")
    assert cfg.preprocess.gpu_decode_backend == ("hardware" if hw else "auto")
    assert cfg.preprocess.gpu_decode_hw_load == (0.6 if system == "ferry_hw60" else 1.0)
    assert cfg.preprocess.overlap_rounds == (system == "ferry_overlap")
    high = system in ("ferry_prio", "ferry_torch_prio")
    assert cfg.preprocess.stream_priority == ("high" if high else "normal")
    swi = system in ("ferry_swi05", "ferry_torch_swi05")
    assert cfg.ingress_deployment.switch_interval_ms == (0.5 if swi else None)
    assert cfg.ingress.direct_port == (8080 if system.endswith("_direct") else None)
    r2 = system in ("ferry_r2", "ferry_torch_r2", "ferry_torch_dyn", "ferry_torch_dyn_direct")
    assert cfg.preprocess.decode_rounds == (2 if r2 else 1)
    engines = {m.engine for m in cfg.models}
    assert engines == ({"torch"} if system in ("ferry_torch", "ferry_torch_kept", "ferry_image",
                                               "ferry_torch_prio", "ferry_torch_swi05",
                                               "ferry_torch_r2", "ferry_image_sleep",
                                               "ferry_torch_dyn", "ferry_torch_dyn_direct",
                                               "ferry_torch_hop2_direct",
                                               "ferry_image_enc16")
                       else {"native"})  # fmt: skip
    dyn = system in ("ferry_torch_dyn", "ferry_torch_dyn_direct", "ferry_torch_hop2_direct")
    assert {m.compile for m in cfg.models} == {"dynamic" if dyn else "static"}
    assert cfg.executor.arenas == ("kept" if system.endswith("_kept") else "pooled")
    keep = 256 << 20 if system == "ferry_keep256" else 0
    assert cfg.preprocess.gpu_decode_keep_bytes == keep
    cpus = cfg.ingress_deployment.num_cpus * cfg.ingress_deployment.num_replicas
    inf = cfg.inference_deployment
    if cfg.placement == "one_process":  # one deployment holds the GPU
        inf = cfg.ingress_deployment
        assert FERRY_SYSTEMS[system] == (inf.num_replicas, None)
    else:
        cpus += inf.num_cpus * inf.num_replicas
        assert (cfg.ingress_deployment.num_replicas, inf.num_replicas) == FERRY_SYSTEMS[system]
    assert inf.num_gpus * inf.num_replicas <= 1  # one H200
    assert cfg.executor.pool_limit_fraction * inf.num_replicas <= 0.95  # the pools share one GPU
    if "preprocess" in cfg.placement_row.deployments:
        cpus += cfg.preprocess_deployment.num_cpus * cfg.preprocess_deployment.num_replicas
    assert cpus <= 14  # leaves the 16-core GPU node room for HAProxy and the load generator


def test_set_overrides_reach_the_served_config_and_name_the_rows():
    sets = parse_sets(
        ["executor.max_in_flight=4", "ingress_deployment.num_replicas=12", "batching.x.y=[1, 2]"]
    )
    assert sets == {
        "executor.max_in_flight": 4,
        "ingress_deployment.num_replicas": 12,
        "batching.x.y": [1, 2],
    }
    cfg = _served("ferry", {"executor.max_in_flight": 4, "ingress_deployment.num_replicas": 12})
    pipeline = cfg["applications"][0]["args"]["config"]
    assert pipeline["executor"]["max_in_flight"] == 4
    assert pipeline["ingress_deployment"]["num_replicas"] == 12
    assert pipeline["executor"]["pool_limit_fraction"] == 0.113  # the rest as in the file
    # a system's own setting, and a --set over it
    sleep = _served("ferry_sleep", {"executor.max_in_flight": 4})["applications"][0]["args"]
    assert sleep["config"]["executor"]["host_wait"] == "sleep"
    assert sleep["config"]["executor"]["max_in_flight"] == 4
    spin = _served("ferry_sleep", {"executor.host_wait": "spin"})["applications"][0]["args"]
    assert spin["config"]["executor"]["host_wait"] == "spin"
    PipelineConfig.model_validate(pipeline)
    assert row_name("ferry", SYSTEMS["ferry"], {"executor.max_in_flight": 4}) == (
        "ferry[executor.max_in_flight=4]"
    )
    assert row_name("ferry", SYSTEMS["ferry"], {}) == "ferry"
    assert row_name("rayserve_expert_8", SYSTEMS["rayserve_expert_8"], sets) == "rayserve_expert_8"
    assert apply_sets({}, {"a.b.c": 1}) == {"a": {"b": {"c": 1}}}
    with pytest.raises(ValueError, match="not a section"):
        apply_sets({"a": 3}, {"a.b": 1})
    for bad in ("executor.max_in_flight", "=3", ".x=1"):
        with pytest.raises(ValueError, match="section.key=value"):
            parse_sets([bad])


def test_a_variant_in_systems_is_its_base_with_its_sets_beside_the_plain_one():
    from benchmarks import bench_e2e

    v = "ferry_torch_r2[executor.max_in_flight=1;batching.max_wait_ms=3]"
    args = bench_e2e.parse_args(["--systems", f"ferry_torch_r2,{v}", "--corpus", "chelsea"])
    full = "ferry_torch_r2[executor.max_in_flight=1,batching.max_wait_ms=3]"
    try:
        assert args.names == ["ferry_torch_r2", full]
        pipeline = _served(full)["applications"][0]["args"]["config"]
        assert pipeline["executor"]["max_in_flight"] == 1
        assert pipeline["batching"]["max_wait_ms"] == 3
        # the base's own sets stay: two decode rounds, ResNet-50 on the torch engine
        assert pipeline["preprocess"]["decode_rounds"] == 2
        assert pipeline["models"][0]["engine"] == "torch"
        plain = _served("ferry_torch_r2")["applications"][0]["args"]["config"]
        assert plain["executor"]["max_in_flight"] == 3  # the base unchanged
        assert SYSTEMS[full]["up_s"] == SYSTEMS["ferry_torch_r2"]["up_s"]
        PipelineConfig.model_validate(pipeline)
    finally:
        SYSTEMS.pop(full, None)
    for bad in ("ferry[executor.max_in_flight=1", "rayserve_expert_8[a.b=1]", "nope[a.b=1]"):
        with pytest.raises(SystemExit):
            bench_e2e.parse_args(["--systems", bad, "--corpus", "chelsea"])


def test_peer_configs_name_their_module_and_replicas():
    from ray.serve.schema import ServeDeploySchema

    raw = _served("rayserve_expert_12")
    ServeDeploySchema.model_validate(raw)
    (app,) = raw["applications"]
    assert app["import_path"] == "benchmarks.peers.rayserve_expert:build_app"
    assert app["args"] == {"replicas": 12}


def test_report_regenerates_results_md_byte_for_byte():
    with open(os.path.join(report.HERE, "RESULTS.md")) as f:
        assert f.read() == report.render()


def test_results_md_opens_with_a_headline_each_figure_with_its_commit_and_date():
    text = report.render()
    heads = [ln for ln in text.splitlines() if ln.startswith("## ")]
    assert heads[0] == "## Headline"  # before every benchmark's section
    start = text.index("| figure | value | measured | machine | current? |")
    rows = text[start:].split("\n\n", 1)[0].splitlines()[2:]
    assert len(rows) >= 8
    for row in rows:
        figure, value, measured, machine, current = (c.strip() for c in row.strip("|").split("|"))
        assert re.fullmatch(r"[0-9a-f]{7}( \(added in\))?, 2\d{3}-\d\d-\d\d", measured), row
        assert figure and value and machine and current, row
    rows = [r for r in report.load("e2e.json")["rows"] if r["system"] == "ferry"]
    top = max((r for r in rows if r["corpus"] == "chelsea"), key=lambda r: r["img_s"])
    # the figure is the JSON's, not a copy
    assert f"| {top['img_s']:,.0f} at {top['clients']} clients" in text


def test_report_has_one_section_per_benchmark_and_rows_carry_their_corpus():
    heads = [ln for ln in report.render().splitlines() if ln.startswith("## ")]
    assert len(heads) == len(set(heads))
    e2e = report.load("e2e.json")
    assert all(r["corpus"] in e2e["corpora"] for r in e2e["rows"])
    assert len(os.listdir(report_base.RES)) <= 22  # (22: streams.png, issue 34's plot)


def test_bench_e2e_keeps_the_output_files_other_keys(tmp_path):
    import json

    from benchmarks import bench_e2e
    from loadtest.corpus import corpus

    out = tmp_path / "e2e.json"
    row = {"system": "rayserve_expert_8", "corpus": "chelsea", "clients": 64, "img_s": 1.0}
    row["run"] = "run3"
    other = {**row, "system": "ferry", "run": "run1"}
    out.write_text(
        json.dumps(
            {
                "rows": [row, other],
                "runs": {"run1": "x", "run3": "y"},
                "profiles": {"p": [1, 2]},
                "peer_notes": {"rayserve_expert_8": "weak", "rayserve_batch_1rep": "usual"},
            }
        )
    )
    args = bench_e2e.parse_args(["--systems", "rayserve_expert_8", "--corpus", "chelsea"])
    args.out = str(out)
    rows, breakdown, described, runs, extra, aside = bench_e2e.kept(args, [corpus("chelsea")])
    # this run is the next number after the highest, not a reuse
    assert rows == [other] and set(runs) == {"run1", "run3", "run4"}
    # the hand-added keys stay; the note on the rows measured again goes with them
    assert extra == {"profiles": {"p": [1, 2]}, "peer_notes": {"rayserve_batch_1rep": "usual"}}
    assert aside["rows"] == [row] and aside["peer_notes"] == {"rayserve_expert_8": "weak"}
    # the system measured again: run3's only row goes, and run3 with it
    new = {**row, "run": "run4", "img_s": 2.0}
    key = {("rayserve_expert_8", "chelsea")}
    r2, b2, runs2, extra2 = bench_e2e.merged(rows + [new], breakdown, runs, extra, aside, key)
    assert r2 == [other, new] and set(runs2) == {"run1", "run4"}
    assert extra2["peer_notes"] == {"rayserve_batch_1rep": "usual"}
    bench_e2e._write(args, described, runs2, r2, b2, extra2)
    doc = json.loads(out.read_text())
    assert list(doc)[: len(e2e_merge.WRITTEN)] == list(e2e_merge.WRITTEN)
    assert doc["profiles"] == {"p": [1, 2]} and doc["rows"] == [other, new]
    assert doc["peer_notes"] == {"rayserve_batch_1rep": "usual"}
    # not measured after all (not started, cut): its row, note and run come back
    r3, _, runs3, extra3 = bench_e2e.merged(rows, breakdown, runs, extra, aside, set())
    assert r3 == [other, row] and set(runs3) == {"run1", "run3", "run4"}
    assert extra3["peer_notes"] == {"rayserve_batch_1rep": "usual", "rayserve_expert_8": "weak"}


def test_budget_says_what_still_fits():
    from benchmarks.common import Budget

    now = [100.0]
    b = Budget(30, clock=lambda: now[0])
    assert b.left() == 30 and b.fits(30) and not b.fits(30.5)
    now[0] = 125.0
    assert b.left() == 5 and b.fits(5) and not b.fits(6)
    assert b.within(60) == 5 and b.within(3) == 3 and b.within(60, reserve_s=2) == 3
    assert b.within(60, reserve_s=9) == 0  # nothing left past the reserve: no wait
    assert Budget(None).fits(1e12) and Budget(None).left() == float("inf")
    assert Budget(None).within(600, reserve_s=50) == 600


def test_a_system_that_does_not_fit_the_budget_is_not_started_and_the_run_says_so(tmp_path):
    """--budget-s below a system's usual start-up and one level: nothing starts (no Serve,
    no port taken), the run's note names what was left out and --strict fails the run."""
    import json
    import time

    from benchmarks import bench_e2e
    from benchmarks.e2e_systems import UP_S

    out = tmp_path / "e2e.json"
    argv = ["--systems", "ferry,rayserve_expert_4", "--corpus", "chelsea", "--clients", "16"]
    argv += ["--seconds", "1", "--warmup", "0", "--budget-s", str(UP_S["ferry"] - 1)]
    t0 = time.monotonic()
    assert bench_e2e.main([*argv, "--out", str(out), "--log-dir", str(tmp_path), "--strict"]) == 1
    assert time.monotonic() - t0 < 30  # nothing was started, nothing waited for
    doc = json.loads(out.read_text())
    assert doc["rows"] == []
    note = doc["runs"]["run1"]
    assert "; ferry not started (" in note and "; rayserve_expert_4 not started (" in note


def test_run_keys_sort_by_number():
    from benchmarks.common import run_no

    runs = {f"run{i}": "" for i in range(1, 12)}
    assert max(runs, key=run_no) == "run11" and max(runs) == "run9"


def test_rows_carry_their_device_and_results_md_says_when_runs_differ():
    import copy
    import json

    from benchmarks.common import gpu_name

    assert (
        gpu_name("NVIDIA H100 80GB HBM3, 81559 MiB, 580.1 | 16 CPU cores")
        == "NVIDIA H100 80GB HBM3"
    )
    assert gpu_name(" | 2 CPU cores | x86_64") == "no GPU"
    path = os.path.join(os.path.dirname(report.__file__), "results", "e2e.json")
    doc = json.load(open(path))
    assert all(r.get("gpu") for r in doc["rows"])  # every committed row names its device
    assert "devices differ" not in "\n".join(report.e2e_section(doc))
    mixed = copy.deepcopy(doc)
    last = max(mixed["runs"], key=run_no)
    for r in mixed["rows"]:
        if r["run"] == last:
            r["gpu"] = "NVIDIA H100 80GB HBM3"
    assert f"{last} on NVIDIA H100 80GB HBM3" in "\n".join(report.e2e_section(mixed))


def test_results_md_shows_the_gpu_and_jpeg_engines_busy_by_level_where_sampled():
    rows = [
        {"system": "ferry", "clients": 64, "gpu_util": 0.862, "gpu_jpeg_util": 0.197},
        {"system": "ferry", "clients": 256, "gpu_util": 0.5, "gpu_jpeg_util": None},
        {"system": "peer", "clients": 64},  # not sampled
    ]
    lines = report_e2e.gpu_lines(rows, [64, 256])
    assert "| ferry | 0.86 / 0.20 | 0.50 / - |" in lines
    assert "| peer | - | not measured |" in lines
    assert report_e2e.gpu_lines([{"system": "ferry", "clients": 64}], [64]) == []


def test_a_level_measured_again_keeps_the_first_in_the_tables_and_lists_the_repeat():
    """``--clients 64,256,64``: the second 64-client row (``repeat`` 2) is no table cell,
    peak or headline figure; RESULTS.md lists it beside the first."""
    import copy
    import json

    path = os.path.join(os.path.dirname(report.__file__), "results", "e2e.json")
    doc = json.load(open(path))
    first = next(r for r in doc["rows"] if r["system"] == "ferry" and r["corpus"] == "chelsea")
    again = {**copy.deepcopy(first), "repeat": 2, "img_s": 123456.0}
    with_repeat = {**doc, "rows": [*doc["rows"], again]}
    text = "\n".join(report.e2e_section(with_repeat))
    assert text.count("123,456") == 1  # in its own line only: no cell, no peak
    assert f"{first['img_s']:,.0f} then 123,456 img/s" in text
    assert "(repeat 2, the system up all along)" in text
    plain = [ln for ln in report.e2e_section(with_repeat) if "(repeat 2" not in ln]
    assert [ln for ln in plain if ln] == [ln for ln in report.e2e_section(doc) if ln]
    assert report_e2e.firsts(with_repeat["rows"]) == doc["rows"]
