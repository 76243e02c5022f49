"""``ferry metrics-url``: the metrics endpoint of every live node, from Ray's node table."""

from __future__ import annotations

import json

import pytest

from deployments import cli_metrics
from deployments.cli import main

NODES = [  # what ray.nodes() gives, the keys that matter
    {"NodeManagerAddress": "10.0.0.5", "MetricsExportPort": 61234, "Alive": True},
    {"NodeManagerAddress": "10.0.0.6", "MetricsExportPort": 8080, "Alive": False},  # gone
    {"NodeManagerAddress": "fe80::1", "MetricsExportPort": 9000, "Alive": True},
    {"NodeManagerAddress": "10.0.0.7", "Alive": True},  # no port (yet)
]


def test_urls_of_the_live_nodes_only():
    assert cli_metrics.metrics_urls(NODES) == [
        "http://10.0.0.5:61234/metrics",
        "http://[fe80::1]:9000/metrics",
    ]


@pytest.fixture
def fake_ray(monkeypatch):
    import ray

    calls = []
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray, "nodes", lambda: NODES)
    monkeypatch.setattr(ray, "shutdown", lambda: calls.append("shutdown"))
    return calls


def test_the_subcommand_prints_one_url_a_line_or_json(fake_ray, capsys):
    assert main(["metrics-url"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "http://10.0.0.5:61234/metrics",
        "http://[fe80::1]:9000/metrics",
    ]
    assert fake_ray[0]["address"] == "auto" and fake_ray[1] == "shutdown"
    assert main(["metrics-url", "--address", "10.0.0.5:6379", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0] == "http://10.0.0.5:61234/metrics"
    assert fake_ray[2]["address"] == "10.0.0.5:6379"


def test_no_cluster_is_exit_1_with_a_hint(monkeypatch, capsys):
    import ray

    def refuse(**kw):
        raise ConnectionError("Could not find any running Ray instance.")

    monkeypatch.setattr(ray, "init", refuse)
    assert main(["metrics-url"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: no running Ray cluster at 'auto'") and "serve run" in err
