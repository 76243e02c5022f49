"""`serve run serve_config.yaml` -- README's main-job command -- brings Ferry up and it answers.

Runs first (file order), before the session cluster of the other integration tests
exists: `serve run` starts its own local Ray, as it does on a laptop.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest

from pipeline.imaging import encode_png
from pipeline.models import digits

pytestmark = pytest.mark.integration
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
URL = "http://127.0.0.1:8000"


def test_readme_uses_serve_config_yaml():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert "serve run serve_config.yaml" in readme


def test_serve_run_serve_config_yaml_answers(tmp_path):
    serve_bin = shutil.which("serve", path=os.path.dirname(sys.executable)) or shutil.which("serve")
    assert serve_bin, "the `serve` command comes with ray[serve]"
    env = {
        k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"
    }  # a fresh local Ray, as on a laptop
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    proc = subprocess.Popen(
        [serve_bin, "run", "serve_config.yaml"],
        cwd=ROOT,
        env=env,
        stdout=(tmp_path / "serve.log").open("wb"),  # a file, not a pipe nobody drains
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 240
        ready = False
        while time.time() < deadline and proc.poll() is None:
            try:
                if httpx.get(URL + "/v2/health/ready", timeout=2).status_code == 200:
                    ready = True
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        if not ready:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            out = (tmp_path / "serve.log").read_text(errors="replace")[-3000:]
            pytest.fail(f"serve run serve_config.yaml did not become ready:\n{out}")
        png = encode_png(digits.load_split()[2][0])
        r = httpx.post(
            URL + "/v1/models/digits/classify",
            content=png,
            headers={"content-type": "image/png"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["top_k"][0]["label"] == "2"
        models = {m["name"] for m in httpx.get(URL + "/v1/models", timeout=10).json()["models"]}
        assert models == {"digits", "resnet50"}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_serve_deploy_to_a_running_ray_start_head(tmp_path):
    """The same file with `serve deploy` against `ray start --head`, as on a cluster."""
    bindir = os.path.dirname(sys.executable)
    ray_bin = shutil.which("ray", path=bindir) or "ray"
    serve_bin = shutil.which("serve", path=bindir) or "serve"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
    env["RAY_AUTH_MODE"] = (
        "token"  # Ray 2.60's `ray start` turns token auth on; the CLI must send it
    )
    subprocess.run(
        [ray_bin, "start", "--head", "--num-cpus", "4", "--disable-usage-stats"],
        cwd=str(tmp_path),
        env=env,
        check=True,
        capture_output=True,
        timeout=180,
    )
    try:
        r = subprocess.run(
            [serve_bin, "deploy", "serve_config.yaml"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        deadline = time.time() + 240
        while time.time() < deadline:
            try:
                if httpx.get(URL + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(2)
        png = encode_png(digits.load_split()[2][0])
        r = httpx.post(
            URL + "/v1/models/digits/classify",
            content=png,
            headers={"content-type": "image/png"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["top_k"][0]["label"] == "2"
    finally:
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
