"""One bad model beside a good one (issue 31, item 1) through the real service on the CPU:
digits and an ONNX file with a TopK, which Ferry refuses at load. The app runs; digits
classifies; every route of the refused model answers Ferry's JSON 503 naming the reason
(node and op), with no Retry-After and no retry hint; readiness is true and lists the
refusal, the model's own readiness says why; ``/v1/models`` and the repository index tell
its state."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from pipeline.imaging import encode_png
from pipeline.models import digits
from tests.integration.helpers import BASE, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
onnx = pytest.importorskip("onnx")


WARMUP_S = 4.0  # an injected warm-up delay: time to see the start-up answers


def _poll_while(deployer: threading.Thread) -> list[tuple[float, float, int, str, str]]:
    """(sent, took, status, content type, body) of readiness asked every 0.25 s while the app
    deploys, until it is ready."""
    seen: list[tuple[float, float, int, str, str]] = []
    t0 = time.monotonic()
    with httpx.Client(base_url=BASE, timeout=30) as c:
        while time.monotonic() - t0 < 180 and (deployer.is_alive() or seen[-1][2] != 200):
            sent = time.monotonic()
            try:
                r = c.get("/v2/health/ready")
            except httpx.TransportError:
                continue
            took = time.monotonic() - sent
            seen.append((sent - t0, took, r.status_code, r.headers.get("content-type", ""), r.text))
            time.sleep(0.25)
    return seen


@pytest.fixture(scope="module")
def app(ray_cluster, tmp_path_factory):
    from tests.onnx_models import topk_image_net

    src = str(tmp_path_factory.mktemp("refused") / "topk.onnx")
    onnx.save(topk_image_net(), src)
    models = [
        {"name": "digits", "arch": "digits"},
        {"name": "my_model", "engine": "onnx", "source": src},
    ]
    cfg = cpu_config(models=models, executor={"faults": {"warmup_delay_s": WARMUP_S}})
    deployer = threading.Thread(target=deploy, args=(cfg,))  # RUNNING: it serves what loads
    deployer.start()
    try:
        yield _poll_while(deployer)
    finally:
        deployer.join(120)
        undeploy()


def test_start_up_answers_are_ferrys_json_at_once_with_why(app):
    ferry = [a for a in app if a[3] == "application/json"]
    assert ferry and ferry[-1][2] == 200, app
    # before the ingress replica runs, Serve's proxy answers (plain text) or holds the
    # request; from the first answer of Ferry's on, every one is JSON and prompt
    first = app.index(ferry[0])
    assert all(a[3] == "application/json" for a in app[first:]), app[first:]
    assert max(a[1] for a in app[first + 1 :]) < 2.0, app
    whys = [json.loads(a[4]).get("why", "") for a in ferry if a[2] == 503]
    assert any(w.startswith("warming: 1 of 2 models loaded, 1 refused") for w in whys), whys


def _refusal(r: httpx.Response) -> dict:
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/json"
    assert "retry-after" not in r.headers and "retry" not in r.text.lower(), r.text
    body = r.json()
    assert body["type"] == "ModelUnavailable" and body["detail"]["model"] == "my_model"
    assert "node='TopK_" in body["error"] and "op='TopK'" in body["error"], body
    return body


def test_the_good_model_classifies_and_the_refused_ones_routes_say_why(app):
    png = encode_png(digits.load_split()[2][0])
    ok = httpx.post(
        BASE + "/v1/models/digits/classify", content=png, headers={"content-type": "image/png"}
    )
    assert ok.status_code == 200 and ok.json()["model"] == "digits", ok.text
    _refusal(
        httpx.post(
            BASE + "/v1/models/my_model/classify",
            content=png,
            headers={"content-type": "image/png"},
        )
    )
    _refusal(httpx.get(BASE + "/v2/models/my_model"))
    _refusal(httpx.get(BASE + "/v2/models/my_model/config"))
    v2 = {
        "inputs": [{"name": "x", "shape": [1, 3, 16, 16], "datatype": "FP32", "data": [0.0] * 768}]
    }
    _refusal(httpx.post(BASE + "/v2/models/my_model/infer", json=v2))


def test_readiness_is_true_and_names_the_refused_model(app):
    r = httpx.get(BASE + "/v2/health/ready")
    assert r.status_code == 200 and r.json()["ready"] is True, r.text
    assert "op='TopK'" in r.json()["refused"]["my_model"]
    assert httpx.get(BASE + "/v2/models/digits/ready").status_code == 200
    bad = httpx.get(BASE + "/v2/models/my_model/ready")
    assert bad.status_code == 503 and bad.json()["why"].startswith("refused: ModelRefused")


def test_the_model_lists_tell_its_state(app):
    listed = {m["name"]: m for m in httpx.get(BASE + "/v1/models").json()["models"]}
    assert listed["digits"]["state"] == "ready"
    assert listed["my_model"]["state"] == "refused" and "TopK" in listed["my_model"]["reason"]
    index = {m["name"]: m for m in httpx.post(BASE + "/v2/repository/index").json()}
    assert index["digits"]["state"] == "READY"
    assert index["my_model"]["state"] == index["my_model_encoded"]["state"] == "UNAVAILABLE"
