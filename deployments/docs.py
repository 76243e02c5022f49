"""``/docs`` without the internet: Swagger UI's own files, served by the ingress.

FastAPI's default ``/docs`` page loads Swagger UI from a CDN and stays blank on a machine
without internet access. Here the page references ``docs/swagger-ui-bundle.js`` and
``docs/swagger-ui.css`` (relative, so a route prefix keeps working) and those come from the
``swagger-ui-bundle-v2`` package (Swagger UI 5, which renders the OpenAPI 3.1 that FastAPI
writes). ReDoc's CDN page is switched off with it.
"""

from __future__ import annotations

import mimetypes
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import Response
from swagger_ui_bundle import swagger_ui_path

ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")


def asset(name: str) -> tuple[bytes, str] | None:
    """The bytes and media type of one of Swagger UI's files, or None (not one of ASSETS)."""
    if name not in ASSETS:
        return None

    data = (swagger_ui_path / name).read_bytes()
    return data, mimetypes.guess_type(name)[0] or "application/octet-stream"


def install(app: FastAPI) -> None:
    """``GET /docs`` and ``GET /docs/{asset}`` on ``app`` (made with ``docs_url=None``)."""

    @app.get("/docs", include_in_schema=False)
    async def docs() -> Any:
        return get_swagger_ui_html(
            openapi_url="openapi.json",
            title=f"{app.title} - API",
            swagger_js_url="docs/swagger-ui-bundle.js",
            swagger_css_url="docs/swagger-ui.css",
            swagger_favicon_url="docs/favicon-32x32.png",
        )

    @app.get("/docs/{name}", include_in_schema=False)
    async def docs_asset(name: str) -> Response:
        found = asset(name)
        if found is None:
            return Response(status_code=404)
        data, media = found
        return Response(data, media_type=media, headers={"cache-control": "max-age=86400"})
