"""The ingress's request-metrics middleware: route templates, request ids, what it counts."""

from __future__ import annotations

import asyncio

import pytest

from deployments import observe
from pipeline import metrics


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/v1/models/digits/classify", ("digits", "/v1/models/{model}/classify")),
        ("/v2/models/resnet50/infer", ("resnet50", "/v2/models/{model}/infer")),
        (
            "/v2/models/digits/versions/1/infer",
            ("digits", "/v2/models/{model}/versions/{version}/infer"),
        ),
        ("/v2/models/digits", ("digits", "/v2/models/{model}")),
        ("/v2/models/digits/config", ("digits", "/v2/models/{model}/config")),
        ("/v2/health/ready", ("", "/v2/health/ready")),
        ("/v2/models/stats", ("", "/v2/models/stats")),
        ("/docs", ("", "/docs")),
        ("/wp-admin/x.php", ("", "other")),
    ],
)
def test_route_templates(path, expected):
    assert observe.route_of(path) == expected


def test_request_id_is_the_clients_or_a_new_one():
    assert observe.request_id_from([(b"x-request-id", b"my-42")]) == "my-42"
    made = observe.request_id_from([(b"x-request-id", b"bad\x01id")])
    assert len(made) == 32 and made != observe.request_id_from([])


class Collect:
    def __init__(self):
        self.records = []

    def put(self, name, op, value, tags=()):
        self.records.append((name, op, value, dict(tags)))


def _run(path: str, status: int, headers=()) -> tuple[dict, Collect]:
    seen = {}

    async def app(scope, receive, send):
        seen.update(scope["state"])
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b""}

    sent = []

    async def send(m):
        sent.append(m)

    scope = {"type": "http", "path": path, "method": "POST", "headers": list(headers)}
    asyncio.run(observe.RequestMetrics(app)(scope, receive, send))
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return seen, sent


def test_successes_and_errors_are_counted_and_successes_timed(monkeypatch):
    c = Collect()
    monkeypatch.setattr(metrics, "_buffer", c)
    seen, _ = _run("/v2/models/digits/infer", 200, [(b"x-request-id", b"r-1")])
    assert seen["request_id"] == "r-1"  # where ingress.request_id_of finds it
    _run("/v1/models/digits/classify", 503)
    _run("/v2/health/live", 200)
    counted = [
        (r[3]["model"], r[3]["route"], r[3]["code"]) for r in c.records if r[0] == "requests"
    ]
    assert counted == [
        ("digits", "/v2/models/{model}/infer", "200"),
        ("digits", "/v1/models/{model}/classify", "503"),
        ("", "/v2/health/live", "200"),
    ]
    totals = [r for r in c.records if r[0] == "stage" and r[3]["stage"] == "total"]
    assert len(totals) == 1 and totals[0][3]["model"] == "digits" and totals[0][2] >= 0
