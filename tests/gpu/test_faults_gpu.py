"""Faults on the cupy backend (issue 17 items 5 and 6): an out-of-memory in the middle of a
batch returns the device pool to its baseline, and in the one-deployment GPU form
(serve_config.gpu.yaml's shape: the ingress holds the inference core) a device error fails
check_health and Serve replaces the replica, while an out-of-memory fails only its batch."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
DIGITS = [{"name": "digits", "arch": "digits"}]


def _gpu_form(faults: list[dict]):
    from pipeline.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "models": DIGITS,
            "executor": {
                "backend": "cupy",
                "buckets": [1, 2, 4, 8],
                "max_in_flight": 2,
                "pool_limit_fraction": 0.05,
                "faults": {"faults": faults},
            },
            "batching": {"max_wait_ms": 2},
            "preprocess": {"threads": 2},
            "placement": "one_process",
            "ingress_deployment": {
                "num_replicas": 1,
                "num_gpus": 0.5,
                "num_cpus": 1,
                "health_check_period_s": 1.0,
                "graceful_shutdown_timeout_s": 2.0,
            },
        }
    )


def test_cupy_oom_mid_batch_returns_the_pool_and_does_not_poison():
    from pipeline.config import ExecutorConfig
    from pipeline.errors import ResourceExhausted
    from pipeline.executor import GpuExecutor

    ex = GpuExecutor(
        ExecutorConfig(
            backend="cupy",
            buckets=(1, 2, 4),
            pool_limit_fraction=0.05,
            faults={"faults": [{"kind": "oom_commit", "at_batch": 2}]},
        )
    )
    ex.load_model("digits", "digits")
    ex.warmup()
    baseline, slots = ex.pool.bytes_in_use, ex.ring.available()
    x = np.random.default_rng(0).integers(0, 255, (3, 8, 8, 1), dtype=np.uint8)
    good = ex.commit(ex.prepare("digits", 3), x).wait(30)
    with pytest.raises(ResourceExhausted):
        ex.commit(ex.prepare("digits", 3), x).wait(30)
    assert ex.pool.bytes_in_use == baseline and ex.ring.available() == slots
    np.testing.assert_allclose(ex.commit(ex.prepare("digits", 3), x).wait(30), good, atol=1e-3)
    assert ex.device_error is None
    ex.probe()  # the device answers
    ex.close()


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray import serve

    from tests.integration.helpers import PORT

    ray.init(include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    yield
    serve.shutdown()
    ray.shutdown()


def test_one_deployment_gpu_form_replaces_a_poisoned_replica(cluster):
    from pipeline.imaging import encode_png
    from pipeline.models import digits
    from tests.integration.helpers import deploy, undeploy
    from tests.integration.test_health import _gone, alive, classify

    png = encode_png(digits.load_split()[2][0])
    deploy(_gpu_form([{"kind": "device_error", "at_batch": 3}]))
    try:
        first = alive("Ingress")
        got = [classify(png) for _ in range(3)]
        assert [r.status_code for r in got[:2]] == [200, 200]
        assert got[2].status_code == 500 and got[2].json()["type"] == "DeviceError"
        t0, ok = time.monotonic(), False
        while time.monotonic() - t0 < 180 and not ok:  # a new replica warms on the GPU
            r = classify(png)
            assert r.status_code in (200, 503), r.text
            ok = r.status_code == 200 and bool(alive("Ingress") - first)
            time.sleep(0.3)
        assert ok, "no replacement replica answered"
        _gone(first, "Ingress")
    finally:
        undeploy()


def test_one_deployment_gpu_form_oom_fails_only_its_batch(cluster):
    from pipeline.imaging import encode_png
    from pipeline.models import digits
    from tests.integration.helpers import deploy, undeploy
    from tests.integration.test_health import alive, classify

    png = encode_png(digits.load_split()[2][0])
    deploy(_gpu_form([{"kind": "oom_commit", "at_batch": 2}]))
    try:
        first = alive("Ingress")
        assert classify(png).status_code == 200
        r = classify(png)
        assert r.status_code == 503 and r.json()["type"] == "ResourceExhausted"
        assert r.headers["retry-after"] == "1"
        for _ in range(5):
            assert classify(png).status_code == 200
        time.sleep(3)  # three health periods: out of memory does not fail check_health
        assert alive("Ingress") == first
    finally:
        undeploy()
