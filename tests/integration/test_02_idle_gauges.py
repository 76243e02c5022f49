"""An idle replica's gauges stay on Ray's metrics endpoint (``pipeline/metrics_buffer.py``:
every gauge is set again every ``refresh_s``), where a gauge Ray is given once leaves it:
its agent drops one not exported again within two report intervals (measured on Ray 2.60:
a gauge set once was gone 20-30 s later). Before the refresh, an idle Ferry replica's queue
depth, pool bytes, executor counts and histograms left Prometheus while it served on (CI at
028607f: the executor's gauges missing from the node's endpoint for a minute).

A Ray of its own (``idle_gauges.py``, in a process of its own), on the worker that runs the
other own-Ray modules (``tests/conftest.py``, ``OWN_RAY``): its waiting sits beside the
integration tests, not in their line."""

from __future__ import annotations

import json
import os
import sys

import pytest

from loadtest.run import subprocess_env
from tests.integration.helpers import run_ok

pytestmark = pytest.mark.integration
HERE = os.path.dirname(os.path.abspath(__file__))


def test_an_idle_processs_gauges_stay_where_a_gauge_set_once_leaves():
    r = run_ok([sys.executable, os.path.join(HERE, "idle_gauges.py")], subprocess_env(), 180)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    reads, want = out["reads"], out["want"]
    print(json.dumps(reads))
    assert reads[-1]["s"] >= out["idle_s"] - 1
    # the control: Ray showed the plain gauge, then dropped it while nothing set it again --
    # what an idle replica's gauges did (if Ray keeps them one day, this says so)
    plain = [x["shown"]["plain"] for x in reads]
    assert want["plain"][1] in plain and plain[-1] is None, plain
    # Ferry's, from their first export on -- while the plain gauge was still shown -- in
    # every read, at the value recorded: on past the read where the plain one had left
    last_plain = max(i for i, v in enumerate(plain) if v is not None)
    for key in ("queue", "executor", "histogram"):
        seen = [x["shown"][key] for x in reads]
        first = next(i for i, v in enumerate(seen) if v is not None)
        assert first <= last_plain and seen[first:] == [want[key][1]] * (len(seen) - first), (
            key,
            seen,
            plain,
        )
