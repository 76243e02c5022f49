"""The object-store channel between actors on two nodes of one machine's Ray cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from loadtest.run import subprocess_env

pytestmark = pytest.mark.integration
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_tensors_cross_nodes_intact_in_order_none_lost():
    env = subprocess_env()
    r = subprocess.run(
        [sys.executable, os.path.join(HERE, "multinode_transport.py")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["cluster_nodes"] == 3
    producer_node, consumer_node = out["nodes"]
    assert producer_node != consumer_node  # placed on different nodes by their custom resources
    sent, got = out["sent"], out["got"]
    assert len(got) == len(sent) == 24  # none lost
    assert [g["seq"] for g in got] == list(range(24))  # in order
    assert got == sent  # intact: same shape, dtype and bytes
