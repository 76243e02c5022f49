"""The user's own ONNX file served over HTTP on the CPU default by the ``onnx`` engine: one
entry ``{name, engine: onnx, source}`` and a real Serve app; v2 with the model's own FP32
input by its name, every output by its name, against onnx's ReferenceEvaluator; classify
through the image path; metadata from the file."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.integration.helpers import BASE, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def app(ray_cluster, tmp_path_factory):
    from tests.onnx_models import small_net

    src = str(tmp_path_factory.mktemp("onnx_model") / "small.onnx")
    onnx.save(small_net(), src)
    models = [
        {"name": "digits", "source": "digits"},
        {"name": "my_model", "engine": "onnx", "source": src},
    ]
    deploy(cpu_config(models=models), name="onnx_models")
    yield src
    undeploy("onnx_models")


def test_v2_by_the_models_own_names_matches_the_reference(app):
    from onnx.reference import ReferenceEvaluator

    meta = httpx.get(BASE + "/v2/models/my_model", timeout=30).json()
    assert meta["platform"] == "onnx"
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    names = [o["name"] for o in meta["outputs"]]
    assert names[:2] == ["logits", "prob"]
    x = np.random.default_rng(0).standard_normal((5, 3, 16, 16)).astype(np.float32)
    r = httpx.post(
        BASE + "/v2/models/my_model/infer",
        json={
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    outs = {
        o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]
    }
    want = dict(
        zip(["logits", "prob"], ReferenceEvaluator(onnx.load(app)).run(None, {"x": x}), strict=True)
    )
    for name in ("logits", "prob"):
        np.testing.assert_allclose(outs[name], want[name], rtol=1e-3, atol=1e-5)


def test_classify_runs_the_image_path(app):
    import simplejpeg
    from onnx.reference import ReferenceEvaluator

    from pipeline.imaging import Target, encode_jpeg, fit
    from tests.integration.helpers import photos

    jpeg = encode_jpeg(photos()["chelsea"])
    r = httpx.post(
        BASE + "/v1/models/my_model/classify?top_k=3",
        content=jpeg,
        headers={"content-type": "image/jpeg"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    top = r.json()["top_k"]
    scores = [t["score"] for t in top]
    assert len(top) == 3 and scores == sorted(scores, reverse=True)
    # the same pixels as Ferry's CPU stage makes them (decode, centre crop to the file's
    # 16x16, ImageNet mean/std), through the reference evaluator
    px = fit(simplejpeg.decode_jpeg(jpeg), Target(16, 16, 3, "center_crop"))
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    x = ((px.transpose(2, 0, 1).astype(np.float32) / 255 - mean) / std)[None]
    logits = ReferenceEvaluator(onnx.load(app)).run(None, {"x": x})[0]
    assert top[0]["class"] == int(logits.argmax())
