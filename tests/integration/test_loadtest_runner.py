"""The load-test runner for a few seconds against the CPU default pipeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.helpers import BASE, ROOT, cpu_config, deploy, run_ok, undeploy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def app(ray_cluster):
    deploy(cpu_config(models=[{"name": "digits", "arch": "digits"}]), name="ferry-load")
    yield BASE
    undeploy("ferry-load")


def test_runner_reports_throughput_and_no_errors(app, tmp_path):
    out = tmp_path / "run"
    corpus = tmp_path / "corpus"
    subprocess.run(
        [sys.executable, "-m", "loadtest.corpus", "--out", str(corpus)],
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    env = {**os.environ, "FERRY_CORPUS": str(corpus)}
    run_ok(
        [
            sys.executable,
            "-m",
            "loadtest.run",
            "--url",
            app,
            "--users",
            "2,4",
            "--seconds",
            "4",
            "--model",
            "digits",
            "--system",
            "ferry-cpu",
            "--out",
            str(out),
        ],
        env,
        180,
    )
    summary = json.load(open(out / "summary.json"))
    assert [row["clients"] for row in summary["rows"]] == [2, 4]
    for row in summary["rows"]:
        assert row["img_s"] > 0 and row["errors"] == 0 and row["requests"] > 0
    assert (out / "summary.png").stat().st_size > 5000
