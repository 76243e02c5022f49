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
        ("resnet50", "READY"),
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
    assert {m["name"] for m in both} == {"digits", "resnet50"}


def _perf_analyzer() -> str | None:
    for p in (
        os.environ.get("FERRY_PERF_ANALYZER"),
        os.path.expanduser("~/.cache/perf-analyzer/pa"),
        shutil.which("perf_analyzer"),
    ):
        if p and os.access(p, os.X_OK):
            return p
    return None


@pytest.mark.skipif(
    _perf_analyzer() is None,
    reason="no perf_analyzer (bash ../shared/tools/get-perf-analyzer.sh; or FERRY_PERF_ANALYZER)",
)
def test_perf_analyzer_runs_unchanged(client, tmp_path):
    out = tmp_path / "pa.csv"
    r = subprocess.run(
        [
            _perf_analyzer(),
            "-m",
            "digits",
            "-u",
            f"127.0.0.1:{PORT}",
            "-i",
            "http",
            "--concurrency-range",
            "1:8:2",
            "-p",
            "2000",
            "-s",  # stability within 50% (a shared 2-core machine is noisy)
            "50",
            "-f",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    rows = out.read_text().splitlines()
    assert rows[0].startswith("Concurrency") and len(rows) == 1 + 4  # 1, 3, 5, 7
    for line in rows[1:]:
        assert float(line.split(",")[1]) > 0  # inferences/s
    json.dumps(rows)
