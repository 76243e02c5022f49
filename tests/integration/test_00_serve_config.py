"""`serve run serve_config.yaml` -- README's main-job command -- brings Ferry up and it answers.

Runs beside the integration tests of the session's local Ray, on the other pytest-xdist
worker (``tests/conftest.py``, ``OWN_RAY``), then test_01_readme: `serve run` starts its own
local Ray, as it does on a laptop -- it would join only a Ray that `ray start` left (its
address in /tmp/ray/ray_current_cluster), never the session's ``ray.init`` one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import tempfile

import httpx
import numpy as np
import pytest

from deployments import portcheck
from loadtest import procs
from loadtest.run import subprocess_env, wait_ready, wait_settled
from pipeline.imaging import encode_png
from pipeline.models import digits
from tests.integration.helpers import ROOT, run_ok

pytestmark = pytest.mark.integration
URL = "http://127.0.0.1:8000"


def test_readme_uses_serve_config_yaml():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "serve run serve_config.yaml" in readme


def _assert_classifies_the_first_held_out_digit() -> None:
    png = encode_png(digits.load_split()[2][0])
    r = httpx.post(
        URL + "/v1/models/digits/classify",
        content=png,
        headers={"content-type": "image/png"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["top_k"][0]["label"] == "2"


def _assert_lists_its_models_and_takes_a_5_mb_image() -> None:
    """It lists its models, and -- in throughput mode the deployments call each other over
    gRPC, whose replica server refuses messages over 4 MB unless told otherwise -- one large
    photo, or a coalesced group of smaller ones, still gets through every hop."""
    models = {m["name"] for m in httpx.get(URL + "/v1/models", timeout=10).json()["models"]}
    assert models == {"digits", "resnet50"}
    noise = np.random.default_rng(0).integers(0, 256, (1300, 1300, 3), dtype=np.uint8)
    big = encode_png(noise)  # incompressible: ~5 MB, under the 8 MB body limit
    assert 4.5e6 < len(big) < 8 << 20
    r = httpx.post(
        URL + "/v1/models/digits/classify",
        content=big,
        headers={"content-type": "image/png"},
        timeout=120,
    )
    assert r.status_code == 200, r.text[-2000:]
    assert len(r.json()["top_k"]) == 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_deploy_to_a_running_ray_start_head(monkeypatch):
    """The same file with `serve deploy` against `ray start --head`, as on a cluster, in
    Serve's throughput mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1, the GPU configs' mode; README's
    `serve run serve_config.yaml` itself, in the plain mode, is run as written by
    test_01_readme: one service start each, ~40 s apiece of the suite's 2 cores)."""
    bindir = os.path.dirname(sys.executable)
    ray_bin = shutil.which("ray", path=bindir) or "ray"
    serve_bin = shutil.which("serve", path=bindir) or "serve"
    # token auth on, as a cluster runs it: `ray start` and `serve deploy` read the token from
    # RAY_AUTH_TOKEN. The test brings its own -- `ray start` makes none, and ~/.ray/auth_token
    # exists on a clean machine only if another test's local Ray happened to write it first
    # (CI on 062bb17 with a new home: "Token authentication is enabled but no authentication
    # token was found"). The run id marks what `ray start` leaves running, so the test stops
    # its own cluster by PID, no other
    run_id = procs.new_run_id("ray-start")
    env = subprocess_env(
        {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            procs.MARK: run_id,
        }
    )
    # its own temp dir: `ray start` writes its address there (ray_current_cluster), where a
    # later ray.init() on this machine would find it -- under /tmp/ray, stale once the
    # cluster is stopped by PID, it would send the next ray.init() to a dead cluster
    temp = tempfile.mkdtemp(prefix="ferry-ray-")  # short: Ray's socket paths live under it
    # the GCS on a free port (--port 0), not 6379, and the dashboard -- where serve deploy
    # sends the config -- on a free port named to both, not 8265: another Ray on the machine
    # may hold either, and serve deploy would then deploy to that one; run_ok shows why a
    # command failed (CI on b515a13: ray start exited 1, its output not kept)
    dash = free_port()
    head = ["start", "--head", "--port", "0", "--dashboard-port", str(dash)]
    run_ok(
        [ray_bin, *head, "--num-cpus", "4", "--disable-usage-stats", "--temp-dir", temp], env, 180
    )
    try:
        run_ok(
            [serve_bin, "deploy", "-a", f"http://127.0.0.1:{dash}", "serve_config.yaml"], env, 180
        )
        assert wait_ready(URL, 240), "serve deploy serve_config.yaml did not become ready"
        # what bench_e2e waits for before it measures: every deployment HEALTHY, read from
        # the dashboard's REST API with the cluster's token
        monkeypatch.setenv("RAY_AUTH_TOKEN", env["RAY_AUTH_TOKEN"])
        assert wait_settled(120, dashboard=f"http://127.0.0.1:{dash}") == []
        _assert_classifies_the_first_held_out_digit()
        _assert_lists_its_models_and_takes_a_5_mb_image()
    finally:
        procs.stop(run_id, grace_s=30)
        shutil.rmtree(temp, ignore_errors=True)
        portcheck.wait_free(8000, 60)  # its Serve proxy may outlive the stop by seconds
