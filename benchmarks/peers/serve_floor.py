"""The floor of Serve's HTTP path: a deployment that reads the request's body and answers a
fixed small JSON, with Starlette's Request and Response as a Ray Serve user writes them.

What a request costs in it is what Serve itself costs -- HAProxy, uvicorn, the replica's
request handling and metrics -- with no work of the app's own: ``profile_pipeline.py --bare``
measures it beside Ferry's ingress on the same machine (issue 28, CPU per request).
"""

from __future__ import annotations

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

ANSWER = b'{"top_k":[{"label":"7","class":7,"score":0.99}]}'
"""About the size of Ferry's classify answer for one class."""


@serve.deployment(max_ongoing_requests=4096)
class Floor:
    async def __call__(self, request: Request) -> Response:
        await request.body()
        return Response(ANSWER, media_type="application/json")
