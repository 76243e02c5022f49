"""One local Ray cluster for the whole integration session; each module deploys its app.

Serve listens on 127.0.0.1:8123 here (8000 is left to the serve_config.yaml test), and its
gRPC proxy, serving Ferry's inference.GRPCInferenceService, on 9123 (``helpers.GRPC_PORT``).
"""

from __future__ import annotations

import pytest

from deployments.grpc_proxy import SERVICER
from tests.integration.helpers import GRPC_PORT, PORT


@pytest.fixture(scope="session")
def ray_cluster():
    import ray
    from ray import serve

    # address="local": a Ray of the session's own, never one a `ray start` left on the machine
    # (ray.init() with no address joins that one, or fails on it)
    ray.init(
        address="local",
        num_cpus=6,
        include_dashboard=False,
        log_to_driver=False,
        ignore_reinit_error=True,
        # metrics exported every 2 s, not Ray's 10: the tests that read the scrape
        # (test_observability, test_triton_stats) wait for an export
        _system_config={"metrics_report_interval_ms": 2000},
    )
    serve.start(
        http_options={"host": "127.0.0.1", "port": PORT},
        grpc_options={"port": GRPC_PORT, "grpc_servicer_functions": [SERVICER]},
    )
    yield
    serve.shutdown()
    ray.shutdown()
