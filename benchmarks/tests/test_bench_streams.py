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
