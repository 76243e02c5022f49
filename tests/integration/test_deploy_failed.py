"""A config whose only model cannot load (issue 31, item 1) through the real service on the
CPU: the inference replica's constructor raises Ferry's one-line ``ModelsRefused``, Serve
tries it 3 times (``min(max_constructor_retry_count 20, 3 x 1 replica)``) and puts the app
into ``DEPLOY_FAILED`` -- ``serve.run`` raises, within a bounded time -- with that line last
in the deployment's status message. Meanwhile the ingress, which is up, answers in Ferry's
JSON: readiness false with why, the model's routes a 503 naming the reason, no retry hint."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.helpers import BASE, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def failed(ray_cluster, tmp_path_factory):
    from tests.onnx_models import topk_image_net

    src = str(tmp_path_factory.mktemp("failed") / "topk.onnx")
    onnx.save(topk_image_net(), src)
    cfg = cpu_config(models=[{"name": "my_model", "engine": "onnx", "source": src}])
    # (bounded: Serve gives up after the tries the message counts; a hang would meet the
    # suite's per-test timeout)
    with pytest.raises(RuntimeError, match="Deploying application ferry failed") as info:
        deploy(cfg)
    yield info.value
    undeploy()


def test_serve_run_fails_within_a_bounded_time_with_ferrys_line_last(failed):
    from ray import serve

    app = serve.status().applications["ferry"]
    assert app.status == "DEPLOY_FAILED"
    inference = app.deployments["Inference"]
    assert "failed to start 3 times in a row" in inference.message, inference.message
    last = inference.message.strip().splitlines()[-1]
    assert last.startswith("pipeline.models.loading.ModelsRefused: no model of the config loads")
    assert "model 'my_model'" in last and "node='TopK_" in last and "op='TopK'" in last, last
    assert app.deployments["Ingress"].status == "HEALTHY"


def test_the_ingress_answers_in_ferrys_json_and_names_the_reason(failed):
    r = httpx.get(BASE + "/v2/health/ready", timeout=10)
    assert r.status_code == 503 and r.json()["ready"] is False, r.text
    assert r.json()["why"].startswith("refused: no model of the config loads: model 'my_model'")
    for ask in (
        lambda c: c.get("/v2/models/my_model"),
        lambda c: c.post("/v1/models/my_model/classify", content=b"\x89PNG\r\n\x1a\n"),
    ):
        with httpx.Client(base_url=BASE, timeout=10) as c:
            resp = ask(c)
        assert resp.status_code == 503 and "retry-after" not in resp.headers, resp.text
        assert resp.json()["type"] == "ModelUnavailable" and "op='TopK'" in resp.json()["error"]
