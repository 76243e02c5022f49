"""`serve run serve_config.gpu.yaml` exactly as shipped, with the two Serve variables its header
names: it becomes ready, answers classify and v2 for both models, and takes a burst of clients
-- on Serve's port, and on Ferry's own listener's too where the config sets
``ingress.direct_port``."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
URL = "http://127.0.0.1:8000"
ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def _direct_port() -> int | None:
    """The shipped config's ``ingress.direct_port``, as Ferry's config model reads it."""
    import yaml

    from pipeline.config import PipelineConfig

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "serve_config.gpu.yaml")) as f:
        app = yaml.safe_load(f)["applications"][0]
    return PipelineConfig.model_validate(app["args"]["config"]).ingress.direct_port


DIRECT = _direct_port()
URLS = [URL] + ([f"http://127.0.0.1:{DIRECT}"] if DIRECT else [])
"""Serve's port, and the replicas' own where the shipped config has them listen."""


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    from loadtest.run import start_app, stop_app, wait_ready

    log = tmp_path_factory.mktemp("shipped") / "serve.log"
    proc = start_app("serve_config.gpu.yaml", str(log), ENV)
    try:
        if not wait_ready(URL, 420, proc):
            pytest.fail(f"not ready:\n{log.read_text(errors='replace')[-4000:]}")
        yield log
    finally:
        stop_app(proc)  # Serve's HAProxy outlives `ray stop`: stop_app ends it by PID


def test_classify_and_v2_answer_for_both_models(shipped):
    import httpx
    import skimage.data

    from pipeline.imaging import encode_jpeg, encode_png
    from pipeline.models import digits

    r = httpx.post(
        URL + "/v1/models/resnet50/classify?top_k=3",
        content=encode_jpeg(skimage.data.chelsea()),
        headers={"content-type": "image/jpeg"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert len(body["top_k"]) == 3 and body["model"] == "resnet50"
    _, _, xte, yte = digits.load_split()
    r = httpx.post(
        URL + "/v1/models/digits/classify",
        content=encode_png(xte[0]),
        headers={"content-type": "image/png"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["top_k"][0]["label"] == str(int(yte[0]))
    meta = httpx.get(URL + "/v2/models/digits", timeout=10).json()
    (inp,) = meta["inputs"]
    shape = [4 if d == -1 else d for d in inp["shape"]]
    x = np.zeros(shape, dtype=np.uint8) if inp["datatype"] == "UINT8" else np.zeros(shape)
    req = {
        "inputs": [
            {
                "name": inp["name"],
                "shape": shape,
                "datatype": inp["datatype"],
                "data": x.ravel().tolist(),
            }
        ]
    }
    r = httpx.post(URL + "/v2/models/digits/infer", json=req, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["shape"][0] == 4


@pytest.mark.parametrize("base", URLS)
def test_a_burst_of_256_clients_is_answered_without_errors(shipped, base):
    import httpx
    import skimage.data

    from pipeline.imaging import encode_jpeg

    jpeg = encode_jpeg(skimage.data.chelsea())

    async def main():
        async with httpx.AsyncClient(base_url=base, timeout=120) as c:
            return await asyncio.gather(
                *(
                    c.post(
                        "/v1/models/resnet50/classify",
                        content=jpeg,
                        headers={"content-type": "image/jpeg"},
                    )
                    for _ in range(256)
                )
            )

    rs = asyncio.run(main())
    assert [r.status_code for r in rs] == [200] * 256, [r.text for r in rs if r.status_code != 200][
        :3
    ]
    sizes = [r.json()["batch_size"] for r in rs]
    assert max(sizes) > 1  # the burst rode in shared GPU batches


def test_1024_jpegs_as_v2_bytes_decode_on_the_gpu_as_classify_does(shipped):
    """resnet50_encoded: one request of 1,024 JPEG files (BYTES, binary extension: 4-byte
    little-endian length + file), decoded by the GPU preprocess path of /v1 classify."""
    import json

    import httpx
    import skimage.data

    from pipeline.imaging import encode_jpeg

    rng = np.random.default_rng(1)
    base = skimage.data.chelsea()
    files = [
        encode_jpeg(base[y : y + 96, x : x + 128])
        for y, x in zip(rng.integers(0, 200, 1024), rng.integers(0, 320, 1024), strict=True)
    ]
    data = b"".join(len(f).to_bytes(4, "little") + f for f in files)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image_bytes",
                    "shape": [len(files), 1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(data)},
                }
            ],
            "outputs": [{"name": "probabilities"}],
        }
    ).encode()
    r = httpx.post(
        URL + "/v2/models/resnet50_encoded/infer",
        content=head + data,
        headers={"inference-header-content-length": str(len(head))},
        timeout=120,
    )
    assert r.status_code == 200, r.text[:2000]
    (out,) = r.json()["outputs"]
    probs = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    assert probs.shape == (1024, 1000)
    for i in (0, 511, 1023):
        one = httpx.post(
            URL + "/v1/models/resnet50/classify?top_k=5",
            content=files[i],
            headers={"content-type": "image/jpeg"},
            timeout=60,
        ).json()["top_k"]
        for t in one:  # fp16 on the GPU: a batch of other sizes may differ in the last bits
            assert abs(probs[i, t["class"]] - t["score"]) < 2e-3, (i, t)
