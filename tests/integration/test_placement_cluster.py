"""Placement on a simulated cluster: a CPU head and a worker with two GPUs (fake resources);
then that worker lost under load, and a new one joined."""

from __future__ import annotations

import json
import os
import sys

import pytest

from loadtest.run import subprocess_env
from tests.integration.helpers import run_ok
from tests.integration.multinode_failover import AFTER_S

pytestmark = pytest.mark.integration
HERE = os.path.dirname(os.path.abspath(__file__))
# the ingress's own answer when the replica holding a request is gone (Ingress._await)
NO_ANSWER = "Unavailable: no answer from downstream by the request's deadline"


@pytest.fixture(scope="module")
def run() -> dict:
    r = run_ok(
        [sys.executable, os.path.join(HERE, "multinode_placement.py")],
        subprocess_env(),
        420,
        stderr_tail=3000,
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_split_form_puts_the_ingress_on_cpu_nodes_and_replicas_per_gpu_on_the_gpus(run):
    out = run
    head, worker = out["head"], out["worker"]
    reps = out["replicas"]
    # replicas_per_gpu 2 x the cluster's 2 GPUs, all on the node that has them
    assert reps["Inference"] == [worker] * 4, reps
    # the CPU stages follow their label selector to the head, though the worker has CPUs left
    for stage in ("Ingress", "Preprocess", "Postprocess"):
        assert reps[stage] == [head], (stage, reps)
    assert out["status"] == 200 and out["answer"]["top_k"][0]["label"] == out["expected_label"]
    # 4 inference replicas x 2 CPUs cannot fit the GPU node's 3: refused before Serve places them
    assert "need 4 inference x 2.0 = 8 CPUs on the GPU nodes, which have 3" in out["refused"]


def test_a_lost_node_sheds_with_503_not_a_hang_and_a_new_node_takes_over(run):
    f = run["failover"]
    rows = [
        dict(zip(("phase", "t", "s", "status", "retry", "why"), r, strict=True)) for r in f["rows"]
    ]
    summary = {
        k: f[k]
        for k in ("removed_at", "not_ready_at", "added_at", "ready_again_at", "running_again_at")
    }
    print("failover:", summary, "requests:", len(rows))
    # every request was answered -- none hung until the client's 60 s, none cut off -- and
    # every answer that was not a 200 is Ferry's JSON 503 with a Retry-After
    assert {r["status"] for r in rows} <= {200, 503}, [
        r for r in rows if r["status"] not in (200, 503)
    ]
    shed = [r for r in rows if r["status"] == 503]
    assert shed and all(r["retry"] for r in shed), shed
    # the requests in flight on the lost node, and those sent to it before Serve knew, are
    # answered by the ingress at their deadline (plus its grace), not when Ray declares the
    # node dead; the rest are refused at admission by the queue budget while slots are held
    # (or Ray's own word that the replica stopped under it, when that came first: CI on bef9099)
    assert all(r["why"].startswith(("Unavailable", "QueueFull")) for r in shed), [
        r["why"] for r in shed
    ]
    assert any(r["why"] == NO_ANSWER for r in shed)
    assert all(r["phase"] != "before" or r["t"] + r["s"] > f["removed_at"] for r in shed)
    # readiness says so while no inference replica is alive, and comes back by itself
    assert f["not_ready_at"] is not None and f["removed_at"] < f["not_ready_at"] <= f["added_at"]
    assert f["ready_again_at"] is not None and f["ready_again_at"] > f["added_at"]
    # recovered: Serve has every replica up again, and the last half of the load after
    # that is all answered
    back = f["running_again_at"]
    assert f["replicas"]["Inference"] == 4, f["replicas"]  # two on each of the worker's GPUs
    assert back is not None and back >= f["ready_again_at"]
    late = [r for r in rows if r["t"] > back + AFTER_S / 2]
    assert len(late) >= 10 and all(r["status"] == 200 for r in late), [
        (round(r["t"] - back, 2), round(r["s"], 2), r["status"], r["why"])
        for r in late
        if r["status"] != 200
    ]
    # the new replicas' books: nothing left allocated or queued after their share of the load
    for books in f["books_after_load"]:
        assert books["pool"]["bytes_in_use"] == 0 and books["queue_depth"] == 0, books
    # (and they served: their batches reserved from the pool)
    assert any(books["pool"]["hits"] > 0 for books in f["books_after_load"])
