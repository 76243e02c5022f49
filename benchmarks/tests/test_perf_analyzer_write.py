"""bench_perf_analyzer keeps a run under ``--key`` beside the file's headline run (the CPU
default beside the H200's), a run without it replaces only the headline, and report.py
renders both (made-up rows, no perf_analyzer)."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import bench_perf_analyzer as B
from benchmarks import report_protocols as report


def _row(model: str, protocol: str, infer_s: float) -> dict:
    return {
        "model": model,
        "protocol": protocol,
        "concurrency": 16,
        "perf_analyzer": {"infer_s": infer_s, "p99_ms": 9.0},
        **({"loadgen": {"img_s": infer_s, "p99_ms": 9.0}, "ratio": 1.0} if protocol == "http" else {"vs_http": 1.1}),
    }  # fmt: skip


def _write(path, config: str, rows: list[dict], key: str | None) -> dict:
    B.write(argparse.Namespace(out=str(path), config=config, key=key), 1.0, rows)
    return json.loads(path.read_text())


def test_a_keyed_run_sits_beside_the_headline_and_both_are_rendered(tmp_path):
    path = tmp_path / "perf_analyzer.json"
    gpu = _write(path, "serve_config.gpu.yaml", [_row("digits", "http", 5000.0)], None)
    assert gpu["config"] == "serve_config.gpu.yaml" and "runs" not in gpu
    both = _write(
        path,
        "serve_config.yaml",
        [_row("digits", "http", 300.0), _row("digits", "grpc", 330.0)],
        "cpu_default",
    )
    assert both["config"] == "serve_config.gpu.yaml" and both["rows"] == gpu["rows"]
    assert both["runs"]["cpu_default"]["config"] == "serve_config.yaml"
    assert [r["protocol"] for r in both["runs"]["cpu_default"]["rows"]] == ["http", "grpc"]
    again = _write(path, "serve_config.gpu.yaml", [_row("digits", "http", 5100.0)], None)
    assert again["rows"][0]["perf_analyzer"]["infer_s"] == 5100.0
    assert again["runs"] == both["runs"]  # a new headline keeps the kept runs
    joined = "\n".join(report.perf_analyzer_sections(again))
    assert joined.index("`serve_config.gpu.yaml`") < joined.index("### `cpu_default`")
    assert "| digits | grpc | 16 | 330.0 |" in joined.split("### `cpu_default`")[1]


def test_an_experiment_is_rendered_value_by_value():
    rows = [
        {"max_groups_in_flight": g, "round": r, "protocol": p, "concurrency": 64, "infer_s": v}
        for g, r, p, v in (
            (4, 1, "grpc", 640.0),
            (4, 2, "grpc", 620.0),
            (2, 1, "grpc", 1040.0),
            (2, 1, "http", 1090.0),
            (4, 1, "http", 1110.0),
        )  # fmt: skip
    ]
    classify = [{"max_groups_in_flight": 4, "img_s": 800.0, "p99_ms": 80.0, "cpu_ms_per_request": 1.7},
                {"max_groups_in_flight": 2, "img_s": 950.0, "p99_ms": 76.0, "cpu_ms_per_request": 1.4}]  # fmt: skip
    exp = {
        "what": "w",
        "machine": "m",
        "date": "d",
        "commit": "c",
        "rows": rows,
        "classify": classify,
    }
    lines = report.experiment_section("max_groups_in_flight", exp)
    assert lines[2] == (
        "| protocol | concurrency | max_groups_in_flight 4, infer/s | max_groups_in_flight 2, infer/s |"
    )
    assert "| http | 64 | 1,110 | 1,090 |" in lines and "| grpc | 64 | 640 / 620 | 1,040 |" in lines
    assert lines.index("| http | 64 | 1,110 | 1,090 |") < lines.index(
        "| grpc | 64 | 640 / 620 | 1,040 |"
    )
    assert "| cpu_ms_per_request | 1.70 | 1.40 |" in lines


def test_a_protocol_profile_lists_the_busy_processes():
    row = lambda p, n, ing, inf, idle: {  # noqa: E731
        "protocol": p,
        "pa_infer_s": n,
        "cpu_ms_per_request": {"ServeReplica:ferry:Ingress": ing, "ServeReplica:ferry:Inference": inf, "ProxyActor": idle},
    }  # fmt: skip
    prof = {"machine": "m", "date": "d", "commit": "c", "config": "serve_config.yaml",
            "model": "digits", "concurrency": 64, "proxy": "HAProxy",
            "rows": [row("http", 1000.0, 0.75, 0.15, -0.002), row("grpc", 650.0, 1.34, 0.55, 0.001)]}  # fmt: skip
    lines = report.protocol_profile_section(prof)
    assert lines[2] == "| protocol | infer/s | ferry:Ingress | ferry:Inference | total |"
    assert lines[4] == "| http | 1000.0 | 0.750 | 0.150 | 0.90 |"  # idle burn off: no ProxyActor
    assert lines[5] == "| grpc | 650.0 | 1.340 | 0.550 | 1.89 |"


def test_each_protocol_is_one_perf_analyzer_interface():
    assert [B.pa_interface(p) for p in B.PROTOCOLS] == [
        ["-i", "http"],
        ["-i", "grpc"],
        ["-i", "grpc", "--streaming"],
    ]
    with pytest.raises(ValueError, match="grpc_foo"):
        B.pa_interface("grpc_foo")
