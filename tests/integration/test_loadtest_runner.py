"""The load-test runner for a few seconds against the CPU default pipeline."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from loadtest.shapes import Pulse, SlowClients
from tests.integration.helpers import BASE, ROOT, cpu_config, deploy, run_ok, undeploy

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def app(ray_cluster):
    cfg = cpu_config(
        models=[{"name": "digits", "arch": "digits"}],
        # a queue budget for a busy 2-core box: at the default 1 s the ingress rightly
        # refused part of a 4-user run with 503 QueueFull when other work shared the cores
        # (CI); these tests are about the runner, whose "errors" would count those
        batching={"queue_policy": {"timeout_ms": 60_000.0}},
    )
    deploy(cfg, name="ferry-load")
    yield BASE
    undeploy("ferry-load")


def _ends_by_itself(argv: list[str], env: dict, limit_s: float, schedule_s: float) -> None:
    """Run a load run that was told to stop after a few seconds: it must exit by itself,
    0, within ``limit_s`` -- a hang guard far past the few seconds and its start-up on a
    busy box, and far short of ``schedule_s``, the shape's own schedule it would follow if
    the limit were ignored."""
    assert limit_s < schedule_s / 2
    try:
        run_ok(argv, env, limit_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"ran past {limit_s} s: the run's limit was not honoured ({argv})")


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
            "2",
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


def test_a_shape_honours_the_run_time_and_writes_csvs(app, tmp_path):
    corpus = tmp_path / "corpus"
    subprocess.run(
        [sys.executable, "-m", "loadtest.corpus", "--out", str(corpus)],
        cwd=ROOT,
        check=True,
        timeout=120,
    )
    env = {**os.environ, "FERRY_CORPUS": str(corpus), "FERRY_MODEL": "digits"}
    env.pop("FERRY_SHAPE_SECONDS", None)
    # locust itself, as the README runs it: the shape stops at -t (its own schedule: 600 s)
    locust = os.path.join(os.path.dirname(sys.executable), "locust")
    _ends_by_itself(
        [
            locust,
            "-f",
            "loadtest/locustfile.py",
            "--headless",
            "--host",
            app,
            "-t",
            "2s",
            "--csv",
            str(tmp_path / "direct"),
            "--only-summary",
            "--loglevel",
            "WARNING",
            "--exit-code-on-error",
            "0",  # (checked below: the only failures allowed are the queue budget's 503s)
        ],
        {**env, "FERRY_SHAPE": "slow", "FERRY_SLOW_BPS": "200000"},
        120,
        SlowClients().duration_s,  # 300 s
    )
    assert (tmp_path / "direct_stats.csv").stat().st_size > 0
    # on two busy cores a burst may pass the queue budget: a shed 503 is a right answer, any
    # other failure is not
    with open(tmp_path / "direct_failures.csv") as f:
        failures = list(csv.DictReader(f))

    # (locust's own wording for classify, the slow user's RuntimeError for slow_classify)
    # (the ingress refuses before it reads a body: a slow upload may meet that 503 as a broken
    # pipe while it still sends -- a connection error, which README counts as safe to retry)
    def shed(r: dict) -> bool:
        early = r["Name"] == "slow_classify" and (
            "BrokenPipe" in r["Error"] or "Reset" in r["Error"]
        )
        return "code=503" in r["Error"] or "'status 503'" in r["Error"] or early

    assert all(shed(r) for r in failures), [
        (r["Name"], r["Error"], r["Occurrences"]) for r in failures if not shed(r)
    ]
    # the runner: --shape for --seconds, CSVs with the per-second history, a summary
    out = tmp_path / "shape"
    _ends_by_itself(
        [
            sys.executable,
            "-m",
            "loadtest.run",
            "--url",
            app,
            "--shape",
            "pulse",
            "--seconds",
            "3",  # three rows of per-second history at least
            "--model",
            "digits",
            "--out",
            str(out),
        ],
        env,
        120,
        Pulse().duration_s,  # 600 s
    )
    (row,) = json.load(open(out / "summary.json"))["rows"]
    assert row["shape"] == "pulse" and row["requests"] > 0
    assert (out / "pulse_stats.csv").stat().st_size > 0
    assert len((out / "pulse_stats_history.csv").read_text().splitlines()) > 2
