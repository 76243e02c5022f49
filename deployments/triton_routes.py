"""Triton's v2 extension routes, a mixin of the ``Ingress`` deployment (Serve finds routes
of base classes too): model configuration, statistics, repository index and model control,
every model route also under ``/versions/{version}`` (version "1"). The logic is in
``pipeline/protocol/triton.py``; this module imports before the ingress's own routes, so
``/v2/models/stats`` is matched before ``/v2/models/{model}``.

(No ``from __future__ import annotations``: FastAPI must see real annotation objects.)
"""

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from pipeline.protocol import triton

from .ingress_http import app


class TritonRoutes:
    """Needs of the class it is mixed into: ``cfg``, ``cards``, ``models``, ``stats``
    (``triton_stats.SharedStats``), ``readiness`` (``readiness.Readiness``),
    ``encoded_views``, ``_model``, ``model_metadata``, ``model_ready`` and ``infer``."""

    def _v2_model(self, name: str) -> str:
        """A model, or (v2 only) a model's encoded view; the model it runs."""
        return self.encoded_views.get(name) or self._model(name)

    @app.get("/v2/models/stats")  # (before /v2/models/{model}, which would take it)
    async def all_model_stats(self) -> dict[str, Any]:
        return await self.stats.model_stats([*self.models, *sorted(self.encoded_views)])

    @app.get("/v2/models/{model}/config")
    async def model_config(self, model: str) -> dict[str, Any]:
        meta = await self.model_metadata(model)
        b = self.cfg.batching
        return triton.model_config(
            model,
            meta,
            self.cards[self._v2_model(model)].engine,
            self.cfg.request_rows,
            self.cfg.batch_of(self._v2_model(model)).buckets,
            b.max_wait_ms,
            b.policy_for(self._v2_model(model)).timeout_ms,
            b.max_queue,
        )

    @app.get("/v2/models/{model}/stats")
    async def model_stats(self, model: str) -> dict[str, Any]:
        self._v2_model(model)
        return await self.stats.model_stats([model])

    @app.post("/v2/repository/index")
    async def repository_index(self) -> list[dict[str, str]]:
        refused = self.readiness.refused  # a model's encoded view is refused with it
        views = {v: refused[m] for v, m in self.encoded_views.items() if m in refused}
        return triton.repository_index(
            [*self.models, *sorted(self.encoded_views)], {**refused, **views}
        )

    @app.post("/v2/repository/models/{model}/load")
    async def load_model(self, model: str) -> None:
        triton.model_control(model, "load")

    @app.post("/v2/repository/models/{model}/unload")
    async def unload_model(self, model: str) -> None:
        triton.model_control(model, "unload")

    @app.get("/v2/models/{model}/versions/{version}")
    async def version_metadata(self, model: str, version: str) -> dict[str, Any]:
        triton.check_version(model, version)
        return await self.model_metadata(model)

    @app.get("/v2/models/{model}/versions/{version}/ready")
    async def version_ready(self, model: str, version: str) -> Response:
        triton.check_version(model, version)
        return await self.model_ready(model)

    @app.get("/v2/models/{model}/versions/{version}/config")
    async def version_config(self, model: str, version: str) -> dict[str, Any]:
        triton.check_version(model, version)
        return await self.model_config(model)

    @app.get("/v2/models/{model}/versions/{version}/stats")
    async def version_stats(self, model: str, version: str) -> dict[str, Any]:
        triton.check_version(model, version)
        return await self.model_stats(model)

    # POST .../versions/{version}/infer: FerryApp serves it (ingress_http.version_infer)
    async def version_infer(self, model: str, version: str, request: Request) -> Response:
        triton.check_version(model, version)
        return await self.infer(model, request)
