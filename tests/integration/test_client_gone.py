"""Metrics that are true, on a real Ferry app: a client that closes its connection before
the answer is counted as code 499 (nginx's and Triton's), never 500; and ``ferry
metrics-url`` names the endpoint those series are scraped from."""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
import urllib.request

import httpx
import numpy as np
import pytest

from tests.integration.helpers import BASE, PORT, cpu_config, deploy, run_ok, undeploy
from tests.integration.test_observability import scrape

pytestmark = pytest.mark.integration
APP = "gone"
ROUTES = ("/v1/models/{model}/classify", "/v2/models/{model}/infer")


@pytest.fixture(scope="module")
def app(ray_cluster):
    deploy(cpu_config(), name=APP)
    yield
    undeploy(APP)


def _send_and_close(head: bytes, body: bytes, wait_s: float) -> None:
    """Send a request (all of ``head``, ``body`` as given) and close the connection after
    ``wait_s`` without reading an answer."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(head + body)
    time.sleep(wait_s)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST: gone
    s.close()


def _codes(series) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, lab, v in series:
        if (
            name == "ray_ferry_requests_total"
            and lab.get("application") == APP
            and lab.get("route") in ROUTES
        ):
            out[lab["code"]] = out.get(lab["code"], 0.0) + v
    return out


def test_a_client_that_closes_before_its_answer_is_counted_499_not_500(app):
    # 1. mid-body: 100 bytes declared, 10 sent, then gone (the replica reads a disconnect);
    # within the upload grace (1 s), and again past it, holding an upload slot
    for wait_s in (0.5, 1.6):
        _send_and_close(
            b"POST /v1/models/digits/classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
            b"Content-Length: 100\r\n\r\n",
            b"\x89PNG\r\n\x1a\n\0\0",
            wait_s,
        )
    # 2. while the model computes: 32 rows of ResNet-50 on numpy take seconds on 2 cores
    x = np.zeros((32, 224, 224, 3), np.uint8)  # (4.8 MB: under the 8 MB body limit)
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "image",
                    "shape": list(x.shape),
                    "datatype": "UINT8",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ]
        }
    ).encode()
    _send_and_close(
        b"POST /v2/models/resnet50/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/octet-stream\r\n"
        + f"Inference-Header-Content-Length: {len(head)}\r\n".encode()
        + f"Content-Length: {len(head) + x.nbytes}\r\n\r\n".encode(),
        head + x.tobytes(),
        1.5,
    )
    deadline = time.time() + 120
    codes: dict[str, float] = {}
    while time.time() < deadline:  # Ray exports on its own period
        codes = _codes(scrape())
        if codes.get("499", 0) >= 3:
            break
        time.sleep(2)
    assert codes.get("499", 0) == 3 and "500" not in codes, codes


def test_ferry_metrics_url_names_this_clusters_endpoint(app):
    import ray

    gcs = ray.get_runtime_context().gcs_address  # (other clusters may run on this box)
    r = run_ok(
        [sys.executable, "-m", "deployments.cli", "metrics-url", "--address", gcs],
        dict(os.environ),
        timeout=120,
    )
    urls = r.stdout.split()
    port = ray._private.worker.global_worker.node.metrics_export_port
    assert len(urls) == 1 and urls[0].endswith(f":{port}/metrics"), r.stdout
    deadline = time.time() + 60
    while True:  # the endpoint it names is the one Ferry's series are on
        text = urllib.request.urlopen(urls[0], timeout=10).read().decode()
        if 'application="gone"' in text or time.time() > deadline:
            break
        httpx.get(BASE + "/v1/models", timeout=30)
        time.sleep(2)
    assert "ray_ferry_requests_total{" in text and 'application="gone"' in text
