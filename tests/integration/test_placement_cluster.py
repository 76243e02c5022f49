"""Placement on a simulated cluster: a CPU head and a worker with two GPUs (fake resources)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from loadtest.run import subprocess_env
from tests.integration.helpers import run_ok

pytestmark = pytest.mark.integration
HERE = os.path.dirname(os.path.abspath(__file__))


def test_split_form_puts_the_ingress_on_cpu_nodes_and_replicas_per_gpu_on_the_gpus():
    r = run_ok(
        [sys.executable, os.path.join(HERE, "multinode_placement.py")],
        subprocess_env(),
        300,
        stderr_tail=3000,
    )
    out = json.loads(r.stdout.strip().splitlines()[-1])
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
