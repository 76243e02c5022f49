"""The ingress's request-metrics middleware: route templates, request ids, what it counts."""

from __future__ import annotations

import asyncio
import contextlib

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

    def observe(self, name, value, tags=(), n=1):
        self.records.extend([(name, "observe", value, dict(tags))] * n)


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


def _count(app, path="/v1/models/digits/classify", receive=None) -> None:
    """Run ``app`` under the middleware (its records go to the patched buffer)."""

    async def sent(m):
        pass

    async def body():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "path": path, "method": "POST", "headers": []}

    async def main():
        with contextlib.suppress(asyncio.CancelledError, RuntimeError):
            await observe.RequestMetrics(app)(scope, receive or body, sent)

    asyncio.run(main())


def _codes(c: Collect) -> list[str]:
    return [r[3]["code"] for r in c.records if r[0] == "requests"]


def test_a_client_that_closes_before_its_answer_is_499_never_500(monkeypatch):
    c = Collect()
    monkeypatch.setattr(metrics, "_buffer", c)

    async def cancelled(scope, receive, send):  # Serve's proxy cancels the request
        raise asyncio.CancelledError

    async def reads_the_disconnect(scope, receive, send):  # then answers anyway (to no one)
        assert (await receive())["type"] == "http.disconnect"
        await send({"type": "http.response.start", "status": 408, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def disconnect():
        return {"type": "http.disconnect"}

    async def bug(scope, receive, send):
        raise RuntimeError("a bug")

    _count(cancelled)
    _count(reads_the_disconnect, receive=disconnect)
    _count(reads_the_disconnect, path="/v2/models/digits/infer", receive=disconnect)

    async def broken():  # Serve's receive once the request is cancelled under it
        raise RuntimeError("the proxy's receive was cancelled")

    async def answers_its_own_500(scope, receive, send):  # as JsonErrors / the fast path do
        try:
            await receive()
        except RuntimeError:
            await send({"type": "http.response.start", "status": 500, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

    _count(answers_its_own_500, receive=broken)
    _count(bug)  # no answer, the client still there: a 500, as before
    assert _codes(c) == ["499", "499", "499", "499", "500"]
    assert not [r for r in c.records if r[0] == "stage"]  # no latency for an unanswered one


def test_a_disconnect_after_the_answer_started_keeps_its_code(monkeypatch):
    c = Collect()
    monkeypatch.setattr(metrics, "_buffer", c)

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await receive()  # the client leaves while the body goes out
        await send({"type": "http.response.body", "body": b"{}"})

    async def disconnect():
        return {"type": "http.disconnect"}

    _count(app, receive=disconnect)
    assert _codes(c) == ["200"]


def test_the_answer_to_a_client_gone_mid_body_is_499_and_no_slow_client():
    import json

    from deployments.http_errors import error_response
    from pipeline.errors import ClientClosedRequest

    got = []

    class Sink:
        def put(self, name, op, value, tags=()):
            got.append((name, dict(tags)))

        def observe(self, name, value, tags=(), n=1):
            got.append((name, dict(tags)))

    old, metrics._buffer = metrics._buffer, Sink()
    try:
        resp = error_response(ClientClosedRequest("the client went away", bytes=3), "r")
    finally:
        metrics._buffer = old
    assert resp.status_code == 499 and json.loads(resp.body)["type"] == "ClientClosedRequest"
    assert got == []  # not counted as a rejection (408's slow_client)
