"""One local Ray cluster for the whole integration session; each module deploys its app.

Serve listens on 127.0.0.1:8123 here (8000 is left to the serve_config.yaml test).
"""

from __future__ import annotations

import pytest

from tests.integration.helpers import PORT


@pytest.fixture(scope="session")
def ray_cluster():
    import ray
    from ray import serve

    ray.init(num_cpus=6, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    serve.start(http_options={"host": "127.0.0.1", "port": PORT})
    yield
    serve.shutdown()
    ray.shutdown()
