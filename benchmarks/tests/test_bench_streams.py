"""bench_streams.py's pieces that need no service: the peer's Serve config and the ratios
of a run's systems, level by level (the run itself: tests/integration/test_streams_peer.py
plays the peer through real Serve, gpu_check.sh smoke-runs the benchmark)."""

from __future__ import annotations

import yaml

from benchmarks import bench_streams as bs
from benchmarks.peers import rayserve_streams as peer


def test_the_peers_config_serves_its_app_with_n_replicas_on_the_port(tmp_path):
    path = bs.peer_config("rayserve_streams_3", 8499, "/m.pt2", str(tmp_path))
    doc = yaml.safe_load(open(path))
    assert doc["http_options"]["port"] == 8499
    (app,) = doc["applications"]
    assert app["import_path"] == "benchmarks.peers.rayserve_streams:build_app"
    assert app["args"]["replicas"] == 3 and app["args"]["model"] == "/m.pt2"
    assert app["args"]["device"] in ("cuda", "cpu")  # cuda where a GPU is visible
    bound = peer.build_app(app["args"] | {"device": "cpu"})._bound_deployment
    assert bound.num_replicas == 3 and bound.ray_actor_options["num_gpus"] == 0
    assert bound.max_ongoing_requests == peer.STREAMS  # a WebSocket holds one for its life
    gpu = peer.build_app({"replicas": 4})._bound_deployment
    assert gpu.ray_actor_options["num_gpus"] == 0.25


def _level(n: int, rate: float, p99: float | None, dropped: float | None = 0.0) -> dict:
    return {
        "streams": n,
        "answers_per_s": rate,
        "latency_ms": {"p99": p99},
        "dropped_pct": dropped,
    }


def test_ferry_is_set_against_each_peer_level_by_level():
    systems = {
        "ferry": {"levels": [_level(1, 30.0, 10.0), _level(8, 240.0, 20.0, 0.5)]},
        "rayserve_streams_8": {"levels": [_level(1, 30.0, 12.0), _level(8, 0.0, None)]},
    }
    assert bs.vs_peer(systems) == [
        {
            "peer": "rayserve_streams_8",
            "streams": 1,
            "answers_per_s_ratio": 1.0,
            "ferry_p99_ms": 10.0,
            "peer_p99_ms": 12.0,
            "ferry_dropped_pct": 0.0,
        },
        {
            "peer": "rayserve_streams_8",
            "streams": 8,
            "answers_per_s_ratio": None,  # the peer answered nothing: no ratio
            "ferry_p99_ms": 20.0,
            "peer_p99_ms": None,
            "ferry_dropped_pct": 0.5,
        },
    ]
    assert bs.vs_peer({"rayserve_streams_8": systems["rayserve_streams_8"]}) == []


def test_a_frames_header_says_its_number_and_its_jpegs_length_or_its_error():
    import json

    assert json.loads(peer.header(3, b"x" * 10, (0.0015, 0.002))) == {
        "frame": 3,
        "bytes": 10,
        "timings_ms": {"queue": 1.5, "batch": 2.0},
    }
    bad = json.loads(peer.header(4, None, (0.0, 0.0)))
    assert bad["frame"] == 4 and "error" in bad and "bytes" not in bad


def test_a_levels_server_cost_is_the_cpu_of_the_runs_processes_over_its_answers():
    """``server_cost`` charges a level the CPU its ``serve run``'s processes spent meanwhile
    (here one marked process that burns 0.5 s of CPU), per frame answered; a process of
    another run, burning as much at the same time, is not charged."""
    import os
    import subprocess
    import sys

    from loadtest import procs

    burn = (
        "import sys, time\nt = time.process_time()\n"
        "while time.process_time() - t < 0.5: pass\n"
        "print('burned', flush=True)\ntime.sleep(2)\n"
    )
    run_id = procs.new_run_id("test")
    started = []

    def play() -> dict:
        for rid in (run_id, procs.new_run_id("other")):
            started.append(
                subprocess.Popen(
                    [sys.executable, "-c", burn],
                    env={**os.environ, procs.MARK: rid},
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for p in started:  # both have burned their 0.5 s (however long that took) and sleep
            assert p.stdout.readline().strip() == "burned"
        return {"streams": 1, "answers_per_s": 100.0}

    level = bs.server_cost(run_id, play)
    for p in started:
        p.wait()
    assert level["streams"] == 1 and level["answers_per_s"] == 100.0  # the level, kept
    # the marked process's 0.5 s (and its interpreter's start), not the other's as well
    assert 0.45 <= level["server_cpu_s"] <= 0.9, level
    per_frame = level["server_cpu_ms_per_frame"]  # its cores over 100 answers a second
    assert abs(per_frame - level["server_cores"] * 10) <= 0.06, level
    assert level["server_threads"] and level["machine_busy_cores"] > 0
    empty = bs.server_cost(procs.new_run_id("none"), lambda: {"answers_per_s": 0.0})
    assert empty["server_cpu_s"] == 0.0 and empty["server_cpu_ms_per_frame"] is None


def test_results_md_shows_each_systems_levels_a_cut_system_and_the_plot(tmp_path):
    import copy
    import json
    import os

    from benchmarks import report_base
    from benchmarks.report_streams import streams_section

    doc = json.load(open(os.path.join(report_base.RES, "streams.json")))
    text = "\n".join(streams_section(doc))
    for name, s in doc["systems"].items():
        assert f"`{name}` (" in text
        for lv in s["levels"]:  # each level's row: streams, opened, refused, offered, answered
            assert f"| {lv['streams']} | {lv['opened']} | {lv['refused']} |" in text
    assert "![streams](results/streams.png)" in text  # the committed plot
    cut = copy.deepcopy(doc)
    cut["systems"] = {"ferry": {"cut": "not started: 12 s left of --budget-s"}}
    cut["vs_peer"] = []
    text = "\n".join(streams_section(cut))
    assert "cut: not started: 12 s left of --budget-s" in text and "no level measured" in text
    png = bs.plot_levels(doc, str(tmp_path / "s.png"))
    assert os.path.getsize(png) > 10_000
