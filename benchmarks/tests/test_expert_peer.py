"""The expert Ray Serve peer (``benchmarks/peers/rayserve_expert.py``): its systems, its
batch sizes and its answers, checked without Ray or a GPU where they can be."""

from __future__ import annotations

import os

import pytest

from benchmarks.bench_e2e import SYSTEMS
from benchmarks.tests.test_bench_e2e import _served
from benchmarks.tests.torchless import assert_builds_without_torch


def test_expert_peer_loads_without_torch_and_sizes_its_batches():
    import sys

    from benchmarks.peers import rayserve_expert as expert

    app = expert.build_app({"replicas": 8})._bound_deployment
    assert app.num_replicas == 8 and app.ray_actor_options["num_gpus"] == 0.125
    # Serve's default is 5 a replica: batches of 128, two in flight, need room for all of them
    assert app.max_ongoing_requests >= expert.BUCKETS[-1] * expert.CONCURRENT_BATCHES
    # one torch thread, sleeping waits, pipelined, the whole CUDA context asleep, torchvision
    assert app.init_args == (1, True, True, True, "torchvision")
    weak = expert.build_app(
        {"replicas": 4, "threads": None, "blocking": False, "pipelined": False}
    )._bound_deployment
    assert weak.ray_actor_options["num_gpus"] == 0.25
    assert weak.init_args == (None, False, False, True, "torchvision")  # (blocking off: spins)
    evwait = expert.build_app({"replicas": 8, "context_sleep": False})._bound_deployment
    assert evwait.init_args == (1, True, True, False, "torchvision")
    nvimg = expert.build_app({"replicas": 8, "decoder": "nvimgcodec"})._bound_deployment
    assert nvimg.init_args == (1, True, True, True, "nvimgcodec")
    batch = expert.ExpertClassifier.func_or_class.classify
    assert batch._get_max_batch_size() == expert.BUCKETS[-1] == 128
    assert batch._get_batch_wait_timeout_s() == expert.WAIT_S == 0.004
    assert [expert.bucket_of(n) for n in (1, 8, 9, 32, 33, 128)] == [8, 8, 32, 32, 128, 128]
    with pytest.raises(ValueError):
        expert.bucket_of(129)
    assert expert.resized_size(300, 451) == (256, 384)  # torchvision's Resize(256)
    assert expert.resized_size(1920, 1080) == (455, 256)
    if "torch" not in sys.modules:  # nothing above needed it
        assert "torchvision" not in sys.modules


def test_expert_peer_module_and_app_load_without_torch():
    assert_builds_without_torch("rayserve_expert", {"replicas": 12})


def test_expert_peer_system_names_pick_its_form():
    served = {s: _served(s)["applications"][0]["args"] for s in SYSTEMS if "expert" in s}
    for n in (4, 8, 12):
        assert served[f"rayserve_expert_{n}"] == {"replicas": n}  # the strong form: defaults
        assert served[f"rayserve_expert_{n}_serial"] == {"replicas": n, "pipelined": False}
        assert served[f"rayserve_expert_{n}_evwait"] == {"replicas": n, "context_sleep": False}
        assert served[f"rayserve_expert_{n}_t1_block"] == {
            "replicas": n,
            "context_sleep": False,
            "pipelined": False,
        }
        assert served[f"rayserve_expert_{n}_weak"] == {
            "replicas": n,
            "threads": None,
            "blocking": False,
            "pipelined": False,
        }


def test_expert_peer_answers_each_image_from_its_row():
    import json

    from benchmarks.peers import rayserve_expert as expert

    labels = [f"c{i}" for i in range(1000)]
    # three images: 0 and 2 the same size (one resize, rows 0 and 1), 1 did not decode
    order = list(expert.size_groups([(300, 451), None, (300, 451)]).values())[0]
    assert order == [0, 2]
    rows = [[0.5, 0.25, 7.0, 999.0], [0.9, 0.1, 3.0, 0.0]]  # top 2: scores, then classes
    got = expert.answers(rows, order, 3, labels)
    assert got[1] is expert.BAD
    assert got[0] == {
        "top_k": [
            {"label": "c7", "class": 7, "score": 0.5},
            {"label": "c999", "class": 999, "score": 0.25},
        ]
    }
    assert got[2]["top_k"][0] == {"label": "c3", "class": 3, "score": 0.9}
    assert expert.answers([], [], 2, labels) == [expert.BAD, expert.BAD]
    coded = expert.encoded(got)
    assert [status for status, _ in coded] == [200, 400, 200]
    assert [json.loads(body) for _, body in coded] == got
    assert expert.size_groups([(1, 2), (3, 4), (1, 2), None]) == {(1, 2): [0, 2], (3, 4): [1]}
    if not os.path.exists("/dev/nvidia0"):  # no GPU: no driver, or one that finds no device
        assert expert.sleep_on_sync() is False
