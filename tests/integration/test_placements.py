"""Every placement that runs on the CPU (``four_stage``, ``split``, ``one_process``) served by
real Serve over real HTTP answers as the others do: the same predictions, the same errors,
v1 and v2, with the deployments its form names and hop timings only where a hop exists.
(``gpu_preprocess`` needs GPUs: tests/gpu/test_nccl_gpu.py.)"""

from __future__ import annotations

import errno
import os
import socket

import httpx
import numpy as np
import pytest

from pipeline.imaging import encode_jpeg, encode_png
from pipeline.models import digits
from pipeline.transport.local_hop import hop_dir
from tests.integration.helpers import (
    BASE,
    PORT,
    classify_many,
    cpu_config,
    deploy,
    photos,
    undeploy,
)

DIRECT_PORT = PORT + 7  # Ferry's own listener (ingress.direct_port) beside Serve's PORT
DIRECT = f"http://127.0.0.1:{DIRECT_PORT}"

pytestmark = pytest.mark.integration


def _answers(base: str) -> dict:
    _, _, xte, yte = digits.load_split()
    pngs = [(encode_png(x), "image/png") for x in xte[:120]]
    rd = classify_many(base, pngs + [(b"not an image", "image/png")], "digits", "?top_k=3")
    bad = [(r.status_code, r.text[:160]) for r in rd[:-1] if r.status_code != 200]
    assert not bad and rd[-1].status_code == 400, (bad[:3], len(bad), rd[-1].status_code)
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
                    "name": "image",
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


def _answers_of(placement: str, direct: bool = False) -> tuple[dict, set]:
    """Deploy the CPU config in this placement, collect its answers and deployments; with
    ``direct``, through Ferry's own listener too (``ingress.direct_port``: ``direct`` in the
    answers, and whether its port refused connections once the app was deleted)."""
    from ray import serve

    over = {"ingress": {"direct_port": DIRECT_PORT, "direct_host": "127.0.0.1"}} if direct else {}
    cfg = cpu_config(placement=placement, **over)  # (the queue budget off, as in every cpu_config)
    deploy(cfg, name=placement)
    try:
        answers = _answers(BASE)
        answers["sockets"] = _hop_sockets(placement)
        if direct:
            answers["direct"] = _answers(DIRECT)
            ready = httpx.get(DIRECT + "/v2/health/ready", timeout=30)  # a route of FastAPI's
            answers["direct_ready"] = (ready.status_code, ready.json())
        return answers, set(serve.status().applications[placement].deployments)
    finally:
        undeploy(placement)
        if direct:
            with socket.socket() as s:
                answers["direct_after"] = s.connect_ex(("127.0.0.1", DIRECT_PORT))


def _hop_sockets(app: str) -> list[str]:
    """The local hop's sockets of ``app`` on this node (``transport/local_hop.py``)."""
    import ray

    d = hop_dir(ray.get_runtime_context().get_node_id(), app)
    return sorted(n for n in os.listdir(d) if n.endswith(".sock")) if os.path.isdir(d) else []


def test_every_cpu_placement_answers_as_the_four_stage_one(ray_cluster):
    plain, deployments_plain = _answers_of("four_stage")
    # decode and answers in the inference replica: one Serve hop per coalesced group
    # (through Ferry's own listener too: the ingress replica holds no executor there, its
    # listener's requests take the local hop as Serve's do -- bench_e2e's hop2 forms)
    split, deployments_split = _answers_of("split", direct=True)
    # the whole pipeline in the ingress replica: no Serve hop at all
    # (and through Ferry's own listener beside Serve's port, deployments/direct.py)
    one, deployments_one = _answers_of("one_process", direct=True)
    assert deployments_plain == {"Ingress", "Preprocess", "Inference", "Postprocess"}
    assert deployments_split == {"Ingress", "Inference"}
    assert deployments_one == {"Ingress"}
    for f in (split, one):
        assert f["acc"] >= 0.95  # 120 digits; the whole held-out set reaches 97% elsewhere
        assert np.array_equal(f["pred"], plain["pred"])
        assert f["top"] == plain["top"]
        assert np.allclose(f["v2"], plain["v2"], rtol=1e-5, atol=1e-5)
        assert f["timings"]["preprocess"] > 0 and "postprocess" in f["timings"]
    # the call to the answering replica is split into the way there and back ...
    t = split["timings"]
    assert t["hop_in"] > 0 and t["hop_out"] > 0
    assert t["hop_in"] + t["hop_out"] <= t["hops"] + 0.01, t  # parts of it (rounding)
    # split's ingress reaches its inference replica over the local hop: its socket is there
    assert len(split["sockets"]) == 1, split["sockets"]
    assert plain["sockets"] == [] and one["sockets"] == []  # no hop there
    # ... and where there is no such call, no hop is stamped
    assert "hop_in" not in one["timings"] and "hop_out" not in one["timings"]
    assert "hop_in" not in plain["timings"]  # answered by the Postprocess deployment
    # Ferry's own listener answers as Serve's port does, every route; gone with the app
    for f in (split, one):
        d = f["direct"]
        assert np.array_equal(d["pred"], f["pred"]) and d["top"] == f["top"]
        assert np.allclose(d["v2"], f["v2"], rtol=1e-5, atol=1e-5)
        assert f["direct_ready"] == (200, {"ready": True})
        assert f["direct_after"] == errno.ECONNREFUSED
    assert "hop_in" in split["direct"]["timings"]  # the listener's requests took the hop
