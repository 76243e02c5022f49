"""Fused stages (decode in the ingress or in the inference replica, answers from the
inference replica) answer as the four-deployment pipeline does: the same predictions, the
same errors, v1 and v2."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from pipeline.imaging import encode_jpeg, encode_png
from pipeline.models import digits
from tests.integration.helpers import BASE, classify_many, cpu_config, deploy, photos, undeploy

pytestmark = pytest.mark.integration


def _answers(base: str) -> dict:
    _, _, xte, yte = digits.load_split()
    pngs = [(encode_png(x), "image/png") for x in xte[:120]]
    rd = classify_many(base, pngs + [(b"not an image", "image/png")], "digits", "?top_k=3")
    assert all(r.status_code == 200 for r in rd[:-1]) and rd[-1].status_code == 400
    pred = np.array([int(r.json()["top_k"][0]["label"]) for r in rd[:-1]])
    photos_ = [(encode_jpeg(img), "image/jpeg") for img in photos().values()]
    rr = classify_many(base, photos_, "resnet50", "?top_k=3")
    assert all(r.status_code == 200 for r in rr)
    top = [[t["class"] for t in r.json()["top_k"]] for r in rr]
    x = np.random.default_rng(0).integers(0, 256, (2, 8, 8, 1)).astype(np.uint8)
    v2 = httpx.post(
        base + "/v2/models/digits/infer",
        json={
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "UINT8",
                    "data": x.ravel().tolist(),
                }
            ],
            "outputs": [{"name": "logits"}],
        },
        timeout=60,
    )
    assert v2.status_code == 200, v2.text
    return {
        "acc": float(np.mean(pred == yte[:120])),
        "pred": pred,
        "top": top,
        "v2": np.array(v2.json()["outputs"][0]["data"]),
        "timings": rd[0].json()["timings_ms"],
    }


def _answers_of(fusion: dict | None, name: str) -> tuple[dict, set]:
    """Deploy the CPU config with these stages fused, collect its answers and deployments."""
    from ray import serve

    deploy(cpu_config(fusion=fusion) if fusion else cpu_config(), name=name)
    try:
        return _answers(BASE), set(serve.status().applications[name].deployments)
    finally:
        undeploy(name)


def test_fused_pipeline_answers_as_the_four_stage_one(ray_cluster):
    plain, _ = _answers_of(None, "plain")
    fused, deployments = _answers_of(
        {"preprocess_in_ingress": True, "postprocess_in_inference": True}, "fused"
    )
    # decode in the inference replica (its threads here; its GPU with preprocess.device gpu)
    in_inf, deployments_inf = _answers_of(
        {"preprocess_in_inference": True, "postprocess_in_inference": True}, "fused_inf"
    )
    # the whole pipeline in the ingress replica: no Serve hop at all
    one, deployments_one = _answers_of(
        {
            "preprocess_in_inference": True,
            "postprocess_in_inference": True,
            "inference_in_ingress": True,
        },
        "one_process",
    )
    assert deployments == deployments_inf == {"Ingress", "Inference"}  # two hops fewer
    assert deployments_one == {"Ingress"}
    for f in (fused, in_inf, one):
        assert f["acc"] >= 0.95  # 120 digits; the whole held-out set reaches 97% elsewhere
        assert np.array_equal(f["pred"], plain["pred"])
        assert f["top"] == plain["top"]
        assert np.allclose(f["v2"], plain["v2"], rtol=1e-5, atol=1e-5)
        assert f["timings"]["preprocess"] > 0 and "postprocess" in f["timings"]
        # answers made in the inference replica split the hops into the call there and back
        t = f["timings"]
        if f is one:  # no Serve call: what is left of a hop is a task switch (may round to 0)
            assert t["hop_in"] >= 0 and t["hop_out"] >= 0
        else:
            assert t["hop_in"] > 0 and t["hop_out"] > 0
        assert t["hop_in"] + t["hop_out"] <= t["hops"] + 0.01, t  # parts of it (rounding)
    assert "hop_in" not in plain["timings"]  # answered by the Postprocess deployment
