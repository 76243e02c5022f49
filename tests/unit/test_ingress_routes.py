"""The ingress app's routes as Ray Serve looks them up: Serve matches every request's path
against the app's routes, in order, to label its metrics (``get_asgi_route_name``), so the
classify route -- nearly all the traffic -- comes first, and every route still resolves to
its own template."""

from __future__ import annotations

import pytest
from ray.serve._private.thirdparty.get_asgi_route_name import get_asgi_route_name

import deployments.ingress  # noqa: F401 - the class's routes join the app
from deployments.ingress_http import app, fast_route


def test_the_routes_that_run_a_model_come_first_after_fastapis_own():
    paths = [getattr(r, "path", None) for r in app.router.routes]
    assert paths[:7] == [
        "/openapi.json",
        "/v1/models/{model}/classify",
        "/v2/models/{model}/infer",
        "/v2/models/{model}/versions/{version}/infer",
        "/v1/models/{model}/image",
        "/v1/models/{model}/segment",
        "/v1/models/{model}/detect",
    ], paths[:8]


@pytest.mark.parametrize(
    "method,path,handler,groups",
    [
        ("POST", "/v1/models/digits/classify", "_classify", ("digits",)),
        ("POST", "/v2/models/digits/infer", "_infer", ("digits", None)),
        ("POST", "/v2/models/digits/versions/1/infer", "_infer", ("digits", "1")),
        ("GET", "/v2/models/digits/infer", None, None),
        ("POST", "/v1/models/unet/image", "_task", ("unet", "image")),
        ("POST", "/v1/models/m/detect", "_task", ("m", "detect")),
        ("POST", "/v1/models/digits/other", None, None),
        ("POST", "/v2/models/digits/versions/1/infer/x", None, None),
        ("POST", "/v2/models/a/b/infer", None, None),
    ],
)
def test_the_fast_routes_take_the_posts_that_run_a_model_only(method, path, handler, groups):
    found = fast_route({"type": "http", "method": method, "path": path})
    if handler is None:
        assert found is None
        return
    match, fn = found
    assert fn.__name__ == handler and match.groups() == groups


@pytest.mark.parametrize(
    "method,path,template",
    [
        ("POST", "/v1/models/digits/classify", "/v1/models/{model}/classify"),
        ("POST", "/v1/models/digits/image", "/v1/models/{model}/image"),
        ("POST", "/v2/models/digits/infer", "/v2/models/{model}/infer"),
        ("POST", "/v2/models/d/versions/1/infer", "/v2/models/{model}/versions/{version}/infer"),
        ("GET", "/v1/models", "/v1/models"),
        ("GET", "/v2/health/ready", "/v2/health/ready"),
        ("GET", "/v1/streams", "/v1/streams"),
    ],
)
def test_each_path_resolves_to_its_own_route(method, path, template):
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    assert get_asgi_route_name(app, scope) == template
