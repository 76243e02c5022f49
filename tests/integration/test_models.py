"""The user's own model served over HTTP on the CPU: a TorchScript file by the torch engine
beside a built-in, through a real Serve app -- classify by its image input, v2 by its own
tensors, metadata with its real specs."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from pipeline.imaging import Target, encode_jpeg, fit
from tests.integration.helpers import BASE, cpu_config, deploy, photos, undeploy

pytestmark = pytest.mark.integration
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def app(ray_cluster, tmp_path_factory):
    from tests.models.small_torch import small_net

    d = tmp_path_factory.mktemp("user_model")
    src = str(d / "small.pt")
    torch.jit.trace(small_net(), torch.zeros(1, 3, 16, 16)).save(src)
    labels = d / "labels.txt"
    labels.write_text("alpha\nbeta\ngamma\ndelta\nepsilon\n")
    mine = {
        "name": "mine",
        "engine": "torch",
        "source": src,
        "input": {"height": 16, "width": 16},
        "labels": str(labels),
        "max_batch": 4,
    }
    deploy(cpu_config(models=[{"name": "digits", "source": "digits"}, mine]), name="models")
    yield
    undeploy("models")


def _reference(x: np.ndarray) -> np.ndarray:
    from tests.models.small_torch import small_net

    with torch.inference_mode():
        return small_net()(torch.from_numpy(x)).numpy()


def test_classify_runs_the_image_path_for_the_users_model(app):
    img = photos()["chelsea"]
    r = httpx.post(
        BASE + "/v1/models/mine/classify?top_k=5",
        content=encode_jpeg(img),
        headers={"content-type": "image/jpeg"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    top = r.json()["top_k"]
    assert [t["label"] for t in top] == [
        ["alpha", "beta", "gamma", "delta", "epsilon"][t["class"]] for t in top
    ]
    # the same image prepared as Ferry's CPU stage does (decode, crop to 16x16), through torch
    import simplejpeg

    px = fit(simplejpeg.decode_jpeg(encode_jpeg(img)), Target(16, 16, 3, "center_crop"))
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    x = ((px.transpose(2, 0, 1).astype(np.float32) / 255 - mean) / std)[None]
    assert top[0]["class"] == int(_reference(x).argmax())
    assert httpx.post(BASE + "/v1/models/mine/classify?top_k=6", content=b"x").status_code == 400


def test_v2_takes_the_models_own_tensors_and_tells_their_specs(app):
    meta = httpx.get(BASE + "/v2/models/mine", timeout=30).json()
    assert meta["platform"] == "torch"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 3, 16, 16]}]
    assert [o["name"] for o in meta["outputs"]] == ["logits", "probabilities"]
    x = np.random.default_rng(0).standard_normal((6, 3, 16, 16)).astype(np.float32)
    r = httpx.post(
        BASE + "/v2/models/mine/infer",
        json={
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "data": x.ravel().tolist(),
                }
            ]
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    outs = {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    np.testing.assert_allclose(outs["logits"], _reference(x), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs["probabilities"].sum(1), 1.0, rtol=1e-5)
    # the built-in beside it keeps its own UINT8 NHWC input
    assert httpx.get(BASE + "/v2/models/digits", timeout=30).json()["inputs"][0]["shape"] == [
        -1,
        8,
        8,
        1,
    ]
    bad = httpx.post(
        BASE + "/v2/models/mine/infer",
        json={
            "inputs": [
                {"name": "input", "shape": [1, 16, 16, 3], "datatype": "UINT8", "data": [0] * 768}
            ]
        },
        timeout=30,
    )
    assert bad.status_code == 400 and bad.json()["detail"]["expected"] == "FP32"
