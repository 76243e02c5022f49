"""Triton's v2 surface with Triton's own client (tritonclient) and perf_analyzer, against a
real Ferry app on the CPU backend (largest bucket 8)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import httpx
import numpy as np
import pytest

from tests.integration.helpers import BASE, PORT, cpu_config, deploy, undeploy

pytestmark = pytest.mark.integration
APP = "triton"


@pytest.fixture(scope="module")
def client(ray_cluster):
    import tritonclient.http as th

    deploy(cpu_config(), name=APP)
    c = th.InferenceServerClient(f"127.0.0.1:{PORT}")
    yield c
    c.close()
    undeploy(APP)


def digits(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 1), dtype=np.uint8)


def infer(client, x, outputs=None, **kw):
    import tritonclient.http as th

    i = th.InferInput("image", list(x.shape), "UINT8")
    i.set_data_from_numpy(x, binary_data=True)
    return client.infer("digits", [i], outputs=outputs, **kw)


def test_server_metadata_config_and_repository_index(client):
    meta = client.get_server_metadata()
    assert set(meta["extensions"]) == {
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "statistics",
    }
    cfg = client.get_model_config("digits")
    assert cfg["name"] == "digits" and cfg["max_batch_size"] >= 1024
    (inp,) = cfg["input"]
    assert inp == {"name": inp["name"], "data_type": "TYPE_UINT8", "dims": [8, 8, 1]}
    assert {o["name"] for o in cfg["output"]} >= {"probabilities"}
    assert cfg["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]
    index = client.get_model_repository_index()
    assert sorted((m["name"], m["state"]) for m in index) == [
        ("digits", "READY"),
        ("digits_encoded", "READY"),
        ("resnet50", "READY"),
        ("resnet50_encoded", "READY"),
    ]
    assert client.is_model_ready("digits", model_version="1")
    assert client.get_model_metadata("digits", model_version="1")["name"] == "digits"


def test_a_batch_past_the_largest_bucket_is_answered_row_for_row(client):
    x = digits(40, seed=3)  # five batches of the largest bucket
    big = infer(client, x).as_numpy("probabilities")
    assert big.shape[0] == 40
    for i in (0, 17, 39):
        one = infer(client, x[i : i + 1]).as_numpy("probabilities")
        np.testing.assert_allclose(big[i], one[0], rtol=1e-5, atol=1e-6)


def test_classification_extension_gives_score_index_label(client):
    import tritonclient.http as th

    x = digits(3, seed=5)
    r = infer(
        client,
        x,
        outputs=[th.InferRequestedOutput("probabilities", binary_data=True, class_count=3)],
    )
    top = r.as_numpy("probabilities")
    assert top.shape == (3, 3)
    probs = infer(client, x).as_numpy("probabilities")
    for row, p in zip(top, probs, strict=True):
        score, index, label = row[0].decode().split(":")
        assert int(index) == int(np.argmax(p)) and label == index  # digits' labels are 0-9
        assert abs(float(score) - float(p.max())) < 1e-5
        scores = [float(e.decode().split(":")[0]) for e in row]
        assert scores == sorted(scores, reverse=True)


def test_versions_priority_timeout_and_flat_parameters(client):
    from tritonclient.utils import InferenceServerException

    x = digits(2, seed=7)
    assert infer(client, x, model_version="1", priority=1).as_numpy("probabilities").shape[0] == 2
    with pytest.raises(InferenceServerException) as e:
        infer(client, x, model_version="2")
    assert "404" in str(e.value) or "version" in str(e.value)
    with pytest.raises(InferenceServerException) as e:  # parameters.timeout: 1 us
        infer(client, x, timeout=1)
    assert "504" in str(e.value) or "deadline" in str(e.value).lower()
    body = {
        "inputs": [
            {
                "name": "image",
                "shape": [1, 8, 8, 1],
                "datatype": "UINT8",
                "data": x[0].ravel().tolist(),
            }
        ]
    }
    r = httpx.post(f"{BASE}/v2/models/digits/versions/1/infer", json=body, timeout=30)
    assert r.status_code == 200
    params = r.json()["parameters"]
    assert params and all(isinstance(v, str | int | float | bool) for v in params.values())
    assert "timings_ms.total" in params


def test_statistics_count_successes_failures_and_durations(client):
    from tritonclient.utils import InferenceServerException

    before = client.get_inference_statistics("digits")["model_stats"][0]
    infer(client, digits(4, seed=9))
    with pytest.raises(InferenceServerException):
        infer(client, digits(1), timeout=1)
    (after,) = client.get_inference_statistics("digits", model_version="1")["model_stats"]
    s0, s1 = before["inference_stats"], after["inference_stats"]
    assert s1["success"]["count"] == s0["success"]["count"] + 1
    assert s1["fail"]["count"] == s0["fail"]["count"] + 1
    assert after["inference_count"] == before["inference_count"] + 4
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert s1[k]["ns"] >= s0[k]["ns"], k
    assert s1["compute_infer"]["ns"] > s0["compute_infer"]["ns"]
    both = client.get_inference_statistics()["model_stats"]
    assert {m["name"] for m in both} == {"digits", "resnet50", "digits_encoded", "resnet50_encoded"}


def pictures(n: int, size: int, channels: int, seed: int = 0) -> list[bytes]:
    """Real image files: JPEGs and PNGs, alternately, of random pixels."""
    from pipeline.imaging import encode_jpeg, encode_png

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a = rng.integers(0, 256, (size, size + 3, channels), dtype=np.uint8)
        out.append(encode_jpeg(a) if i % 2 else encode_png(a))
    return out


def infer_encoded(client, model, blobs, binary=True, outputs=None):
    import base64

    import tritonclient.http as th

    i = th.InferInput("image_bytes", [len(blobs), 1], "BYTES")
    if binary:  # each element: 4-byte little-endian length, the file's bytes
        i.set_data_from_numpy(np.array(blobs, dtype=object).reshape(-1, 1), binary_data=True)
    else:  # JSON: a string an element, the file in base64
        b64 = [base64.b64encode(b) for b in blobs]
        i.set_data_from_numpy(np.array(b64, dtype=object).reshape(-1, 1), binary_data=False)
    return client.infer(f"{model}_encoded", [i], outputs=outputs)


def classify_v1(model, blob, k):
    r = httpx.post(f"{BASE}/v1/models/{model}/classify?top_k={k}", content=blob, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["top_k"]


def test_encoded_views_are_advertised_as_bytes_models(client):
    meta = client.get_model_metadata("resnet50_encoded")
    assert meta["inputs"] == [{"name": "image_bytes", "datatype": "BYTES", "shape": [-1, 1]}]
    assert {o["name"] for o in meta["outputs"]} == {
        o["name"] for o in client.get_model_metadata("resnet50")["outputs"]
    }
    cfg = client.get_model_config("digits_encoded", model_version="1")
    assert cfg["input"] == [{"name": "image_bytes", "data_type": "TYPE_STRING", "dims": [1]}]
    assert client.is_model_ready("digits_encoded")
    names = {m["name"] for m in client.get_model_repository_index()}
    assert {"digits_encoded", "resnet50_encoded"} <= names


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_jpeg_and_png_bytes_answer_as_v1_classify_does(client, binary):
    for model, size, channels in (("digits", 8, 1), ("resnet50", 64, 3)):
        blobs = pictures(2, size, channels, seed=11)
        probs = infer_encoded(client, model, blobs, binary).as_numpy("probabilities")
        assert probs.shape[0] == 2
        for blob, p in zip(blobs, probs, strict=True):
            top = classify_v1(model, blob, 5)
            assert [t["class"] for t in top] == list(np.argsort(-p, kind="stable")[:5])
            np.testing.assert_allclose([t["score"] for t in top], np.sort(p)[::-1][:5], atol=1e-6)


def test_classification_of_encoded_images_and_bad_images_are_ferry_4xx(client):
    import tritonclient.http as th
    from tritonclient.utils import InferenceServerException

    blobs = pictures(3, 8, 1, seed=2)
    out = [th.InferRequestedOutput("probabilities", binary_data=True, class_count=2)]
    top = infer_encoded(client, "digits", blobs, outputs=out).as_numpy("probabilities")
    for blob, row in zip(blobs, top, strict=True):
        want = classify_v1("digits", blob, 2)
        assert [int(e.decode().split(":")[1]) for e in row] == [t["class"] for t in want]
    with pytest.raises(InferenceServerException) as e:
        infer_encoded(client, "digits", [blobs[0], b"GIF89a not a JPEG or PNG"])
    assert e.value.status() == "415"
    i = th.InferInput("image_bytes", [2, 1], "BYTES")
    i.set_data_from_numpy(np.array([[blobs[0]], [b"GIF89a"]], dtype=object), binary_data=True)
    body, hl = th.InferenceServerClient.generate_request_body([i])
    r = httpx.post(
        f"{BASE}/v2/models/digits_encoded/infer",
        content=body,
        headers={"Inference-Header-Content-Length": str(hl)},
        timeout=30,
    )
    assert r.status_code == 415 and r.json()["detail"]["element"] == 1, r.text
    body = {
        "inputs": [{"name": "image_bytes", "shape": [1, 1], "datatype": "BYTES", "data": ["%%"]}]
    }
    r = httpx.post(f"{BASE}/v2/models/digits_encoded/infer", json=body, timeout=30)
    assert r.status_code == 400 and "base64" in r.json()["error"], r.text


def test_input_and_output_names_the_model_does_not_have_are_400s_listing_its_own(client):
    """As Triton: a tensor by a name the model does not have is refused, never ignored."""
    import base64

    from pipeline.imaging import encode_png

    png = base64.b64encode(encode_png(np.zeros((8, 8, 1), np.uint8))).decode()
    good = {
        "digits": {"shape": [1, 8, 8, 1], "datatype": "UINT8", "data": [0] * 64},
        "digits_encoded": {"shape": [1, 1], "datatype": "BYTES", "data": [png]},
    }
    own = {"digits": "image", "digits_encoded": "image_bytes"}
    outputs = [o["name"] for o in client.get_model_metadata("digits")["outputs"]]
    for model, tensor in good.items():
        url = f"{BASE}/v2/models/{model}/infer"
        ok = httpx.post(url, json={"inputs": [{"name": own[model], **tensor}]}, timeout=30)
        assert ok.status_code == 200, ok.text
        r = httpx.post(url, json={"inputs": [{"name": "bogus", **tensor}]}, timeout=30)
        assert r.status_code == 400, r.text
        body = r.json()
        assert body["type"] == "InvalidInput" and body["request_id"]
        assert body["error"] == f"unknown input 'bogus'; the model's inputs: {own[model]}"
        assert body["detail"]["input"] == "bogus" and own[model] in body["detail"]["inputs"]
        asked = {"inputs": [{"name": own[model], **tensor}], "outputs": [{"name": "bogus"}]}
        r = httpx.post(url, json=asked, timeout=30)
        assert r.status_code == 400, r.text
        assert (
            r.json()["error"]
            == f"unknown output 'bogus'; the model's outputs: {', '.join(outputs)}"
        )
        assert r.json()["detail"]["output"] == "bogus"


def test_a_v2_batch_of_1024_images_is_answered(client):
    blobs = pictures(1024, 8, 1, seed=4)
    probs = infer_encoded(client, "digits", blobs).as_numpy("probabilities")
    assert probs.shape == (1024, 10)
    for i in (0, 513, 1023):
        top = classify_v1("digits", blobs[i], 3)
        assert [t["class"] for t in top] == list(np.argsort(-probs[i], kind="stable")[:3])


def test_load_and_unload_are_refused_as_in_model_control_mode_none(client):
    from tritonclient.utils import InferenceServerException

    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException) as e:
            call("digits")
        assert e.value.status() == "400" and "model control mode is NONE" in str(e.value)
    assert client.is_model_ready("digits")


def _perf_analyzer() -> str | None:
    for p in (
        os.environ.get("FERRY_PERF_ANALYZER"),
        os.path.expanduser("~/.cache/perf-analyzer/pa"),
        shutil.which("perf_analyzer"),
    ):
        if p and os.access(p, os.X_OK):
            return p
    return None


needs_pa = pytest.mark.skipif(
    _perf_analyzer() is None,
    reason="no perf_analyzer (bash ../shared/tools/get-perf-analyzer.sh; or FERRY_PERF_ANALYZER)",
)


def run_perf_analyzer(tmp_path, model: str, *args: str) -> list[str]:
    """perf_analyzer as a Triton user runs it, its CSV rows (the header first)."""
    out = tmp_path / f"{model}.csv"
    # -s 1000: any three windows within 11x of each other count as stable -- these tests check
    # that perf_analyzer runs unchanged, not a rate; at -s 50 a box at load 18 gave none stable
    # in 10 windows (exit 2), which says nothing of Ferry
    r = subprocess.run(
        [_perf_analyzer(), "-m", model, "-u", f"127.0.0.1:{PORT}", "-i", "http", *args]
        + ["-s", "1000", "-f", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = out.read_text().splitlines()
    assert rows[0].startswith("Concurrency")
    for line in rows[1:]:
        assert float(line.split(",")[1]) > 0  # inferences/s
    return rows


@needs_pa
def test_perf_analyzer_runs_unchanged(client, tmp_path):
    # two levels of 1 s windows: it checks that perf_analyzer runs against Ferry unchanged,
    # not how fast (benchmarks/)
    rows = run_perf_analyzer(tmp_path, "digits", "--concurrency-range", "1:5:4", "-p", "1000")
    assert len(rows) == 1 + 2  # 1, 5


@needs_pa
def test_perf_analyzer_sends_jpeg_bytes_to_resnet50(client, tmp_path):
    """--input-data as Triton documents it for a BYTES input: base64 of the serialised
    element (4-byte length, then the JPEG)."""
    import base64

    from tritonclient.utils import serialize_byte_tensor

    jpegs = [b for b in pictures(4, 96, 3, seed=8) if b[:2] == b"\xff\xd8"]
    data = {
        "data": [
            {
                "image_bytes": {
                    "b64": base64.b64encode(
                        serialize_byte_tensor(np.array([j], dtype=object)).item()
                    ).decode()
                }
            }
            for j in jpegs
        ]
    }
    (tmp_path / "jpegs.json").write_text(json.dumps(data))
    before = client.get_inference_statistics("resnet50_encoded")["model_stats"][0]
    rows = run_perf_analyzer(
        tmp_path,
        "resnet50_encoded",
        "--input-data",
        str(tmp_path / "jpegs.json"),
        "--concurrency-range",
        "2",
        "-p",
        "1000",
    )
    assert len(rows) == 1 + 1
    after = client.get_inference_statistics("resnet50_encoded")["model_stats"][0]
    assert (
        after["inference_stats"]["success"]["count"] > before["inference_stats"]["success"]["count"]
    )
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
