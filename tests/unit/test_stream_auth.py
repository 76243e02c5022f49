"""The bearer token guards WebSocket streams as it guards every route: a handshake without it
is answered 401 where the server speaks ``websocket.http.response``, else refused (403)."""

from __future__ import annotations

import asyncio

import orjson

from deployments.ingress_http import BearerAuth


class App:
    def __init__(self) -> None:
        self.called = False

    async def __call__(self, scope, receive, send) -> None:
        self.called = True


def _handshake(auth: BearerAuth, headers: list, extensions: dict | None) -> list[dict]:
    sent: list[dict] = []
    scope = {"type": "websocket", "path": "/v1/streams/digits", "headers": headers}
    if extensions is not None:
        scope["extensions"] = extensions

    async def receive() -> dict:
        return {"type": "websocket.connect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(auth(scope, receive, send))
    return sent


def test_a_stream_without_the_token_is_refused_at_its_handshake(monkeypatch):
    monkeypatch.setenv("FERRY_AUTH_TOKEN", "t0k")
    app = App()
    auth = BearerAuth(app)
    sent = _handshake(auth, [], {"websocket.http.response": {}})
    assert [m["type"] for m in sent] == [
        "websocket.http.response.start",
        "websocket.http.response.body",
    ]
    assert sent[0]["status"] == 401
    assert orjson.loads(sent[1]["body"])["error"] == "missing or wrong bearer token"
    sent = _handshake(auth, [(b"authorization", b"Bearer nope")], None)
    assert sent == [{"type": "websocket.close", "code": 1008}] and not app.called
    assert _handshake(auth, [(b"authorization", b"Bearer t0k")], None) == [] and app.called
