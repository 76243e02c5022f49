"""Locust users for Ferry. Run locust as its own process (``python -m loadtest.run`` does);
never import this into a process that imported ssl first (Ray does) -- gevent breaks.

    locust -f loadtest/locustfile.py --host http://127.0.0.1:8000 ClassifyUser
    FERRY_SHAPE=step locust -f loadtest/locustfile.py --headless --host ...

Environment: FERRY_MODEL (resnet50), FERRY_CORPUS (loadtest/corpus, made by
``python -m loadtest.corpus``), FERRY_SHAPE (step | pulse | slow; unset: -u/-r/-t decide),
FERRY_SHAPE_SECONDS (how long a shape runs; else -t/--run-time, else the shape's schedule),
FERRY_CONTENT_TYPE (only the corpus files of this type, e.g. image/jpeg),
FERRY_SLOW_BPS (bytes per second of slow uploads, 20000), FERRY_HONOUR_RETRY_AFTER (1: a
refused ClassifyUser waits the 503's Retry-After before it asks again), FERRY_PULSE_USERS (the pulse's
sustained level, 64), FERRY_EVENTS (a file: one line per request -- wall time, name, status,
ms, whether an error answer was Ferry's JSON with a request id, its Retry-After, and either
the queue and reason of a refusal or an answer's ``timings_ms`` parts -- and a
``start`` line when the test starts, for analyses locust's percentiles cannot give, such as
the accepted requests' p99 within the bursts).
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid

import gevent
import numpy as np
from gevent import socket
from locust import FastHttpUser, LoadTestShape, events, task

from loadtest import shapes

MODEL = os.environ.get("FERRY_MODEL", "resnet50")
CORPUS = os.environ.get("FERRY_CORPUS", os.path.join(os.path.dirname(__file__), "corpus"))
SLOW_BPS = float(os.environ.get("FERRY_SLOW_BPS", "20000"))
INPUT = {"resnet50": (224, 224, 3), "digits": (8, 8, 1)}


def _corpus() -> list[tuple[bytes, str]]:
    index_path = os.path.join(CORPUS, "index.json")
    if not os.path.exists(index_path):
        from loadtest.corpus import build

        build(CORPUS)
    with open(index_path) as f:
        index = json.load(f)
    only = os.environ.get("FERRY_CONTENT_TYPE")  # e.g. image/jpeg: that kind alone
    out = []
    for e in index:
        if only and e["content_type"] != only:
            continue
        with open(os.path.join(CORPUS, e["file"]), "rb") as f:
            out.append((f.read(), e["content_type"]))
    return out


IMAGES = _corpus()
_EVENTS = os.environ.get("FERRY_EVENTS")
_PARTS = ("coalesce", "ingress", "preprocess", "queue", "gpu", "hops")  # of timings_ms
if _EVENTS:
    _log = open(_EVENTS, "a", buffering=1)  # noqa: SIM115 -- open for the process's life

    @events.test_start.add_listener
    def _started(**_kw) -> None:
        _log.write(f"{time.time():.3f},start,0,0,1,\n")

    @events.request.add_listener
    def _record(name, response_time, response=None, **_kw) -> None:
        status = getattr(response, "status_code", 0) or 0
        ferry_json, retry, where = 1, "", ""
        try:
            body = json.loads(response.content or b"") if status else {}
        except (ValueError, AttributeError):
            body = None
        if status and status != 200:
            ferry_json = int(isinstance(body, dict) and bool(body.get("error")))
            ferry_json &= int(isinstance(body, dict) and bool(body.get("request_id")))
            retry = (response.headers or {}).get("retry-after", "") or ""
            detail = body.get("detail") if isinstance(body, dict) else None
            if isinstance(detail, dict):  # which queue refused it, and why
                where = f"{detail.get('queue') or ''}:{detail.get('reason') or ''}"
        elif isinstance(body, dict) and isinstance(body.get("timings_ms"), dict):
            t = body["timings_ms"]  # where an answered request's time went
            where = ";".join(f"{k}={t[k]:.0f}" for k in _PARTS if isinstance(t.get(k), float | int))
        _log.write(
            f"{time.time():.3f},{name},{status},{response_time:.2f},{ferry_json},{retry},{where}\n"
        )


def _v2_body() -> tuple[bytes, str]:
    shape = INPUT.get(MODEL, (224, 224, 3))
    x = np.random.default_rng(0).integers(0, 256, (1, *shape), dtype=np.uint8).tobytes()
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": [1, *shape],
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": len(x)},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + x, str(len(head))


HONOUR_RETRY_AFTER = os.environ.get("FERRY_HONOUR_RETRY_AFTER") == "1"


def _back_off(response) -> None:
    """With FERRY_HONOUR_RETRY_AFTER=1, a client refused with 503 waits its Retry-After (at
    most 10 s) before it asks again, as README asks of clients; else it asks again at once."""
    if HONOUR_RETRY_AFTER and getattr(response, "status_code", 0) == 503:
        try:
            wait = float((response.headers or {}).get("retry-after") or 1.0)
        except ValueError:
            wait = 1.0
        gevent.sleep(min(10.0, max(0.0, wait)))


class ClassifyUser(FastHttpUser):
    """Posts corpus images (JPEG and PNG, several sizes) to /v1/models/{model}/classify."""

    weight = 3

    @task
    def classify(self) -> None:
        data, ct = random.choice(IMAGES)
        r = self.client.post(
            f"/v1/models/{MODEL}/classify",
            data=data,
            name="classify",
            headers={"content-type": ct, "x-request-id": uuid.uuid4().hex},
        )
        _back_off(r)


class V2User(FastHttpUser):
    """Posts a binary uint8 tensor to /v2/models/{model}/infer (binary tensor extension)."""

    weight = 1
    body, header_len = _v2_body()

    @task
    def infer(self) -> None:
        self.client.post(
            f"/v2/models/{MODEL}/infer",
            data=self.body,
            name="v2_infer",
            headers={
                "content-type": "application/octet-stream",
                "x-request-id": uuid.uuid4().hex,
                "inference-header-content-length": self.header_len,
            },
        )


class SlowUploadUser(FastHttpUser):
    """Uploads an image at FERRY_SLOW_BPS bytes a second over a raw socket, like a phone on
    a bad link; reports to locust like any request."""

    weight = 1

    @task
    def slow_classify(self) -> None:
        data, ct = random.choice(IMAGES)
        host = self.host.split("://", 1)[-1].rstrip("/")
        name, _, port = host.partition(":")
        rid = uuid.uuid4().hex
        head = (
            f"POST /v1/models/{MODEL}/classify HTTP/1.1\r\nHost: {host}\r\nContent-Type: {ct}\r\n"
            f"Content-Length: {len(data)}\r\nX-Request-ID: {rid}\r\nConnection: close\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        exc = None
        length = 0
        try:
            s = socket.create_connection((name, int(port or 80)), timeout=120)
            s.sendall(head)
            chunk = max(1, int(SLOW_BPS / 10))
            for i in range(0, len(data), chunk):
                s.sendall(data[i : i + chunk])
                gevent.sleep(0.1)
            resp = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                resp += b
            s.close()
            length = len(resp)
            status = int(resp.split(b" ", 2)[1]) if resp.startswith(b"HTTP/") else 0
            if status != 200:
                exc = RuntimeError(f"status {status}")
        except OSError as e:
            exc = e
        self.environment.events.request.fire(
            request_type="POST",
            name="slow_classify",
            response_time=(time.perf_counter() - t0) * 1e3,
            response_length=length,
            exception=exc,
            context={},
        )


def _stats(env) -> dict:
    total = env.stats.total
    return {
        "p99_ms": total.get_current_response_time_percentile(0.99) or 0.0,
        "fail_ratio": total.fail_ratio,
        "rps": total.current_rps,
    }


_SHAPES = ("step", "pulse", "slow")
_CHOSEN = os.environ.get("FERRY_SHAPE", "")
_SECONDS = os.environ.get("FERRY_SHAPE_SECONDS")


def _run_limit(env) -> float | None:
    """How long the shape may run: FERRY_SHAPE_SECONDS, else locust's --run-time (which
    locust itself does not apply to a shape), else the shape's own schedule."""
    if _SECONDS:
        return float(_SECONDS)
    rt = getattr(getattr(env, "parsed_options", None), "run_time", None)
    return float(rt) if rt else None


if _CHOSEN:
    if _CHOSEN not in _SHAPES:
        raise SystemExit(f"FERRY_SHAPE must be one of {sorted(_SHAPES)}, not {_CHOSEN!r}")

    class FerryShape(LoadTestShape):
        logic = None
        classes = {"ClassifyUser": ClassifyUser, "V2User": V2User, "SlowUploadUser": SlowUploadUser}

        def tick(self):
            env = self.runner.environment
            limit = _run_limit(env)
            if self.logic is None:
                users = os.environ.get("FERRY_PULSE_USERS")
                self.logic = shapes.make(_CHOSEN, limit, int(users) if users else None)
            if shapes.limited(self.get_run_time(), limit):
                return None
            out = self.logic.tick(self.get_run_time(), _stats(env))
            if out is None:
                return None
            users, rate, weights = out
            if not weights:
                return users, rate, [ClassifyUser]
            for name, share in weights.items():
                self.classes[name].weight = max(1, round(share * 100))
            return users, rate, [self.classes[n] for n in weights]
