"""The floor of Serve's HTTP path: a deployment that reads the request's body and answers a
fixed small JSON, with Starlette's Request and Response as a Ray Serve user writes them.

What a request costs in it is what Serve itself costs -- HAProxy, uvicorn, the replica's
request handling and metrics -- with no work of the app's own: ``profile_pipeline.py --bare``
measures it beside Ferry's ingress on the same machine (issue 28, CPU per request).
``BatchedFloor`` (``--bare batched``) makes each request wait for the next 2 ms tick before
it answers, as Ferry's requests wait for their coalesced call: what a request that is not
answered at once costs Serve and asyncio, with still no work of the app's own.
"""

from __future__ import annotations

import asyncio

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


@serve.deployment(max_ongoing_requests=4096)
class BatchedFloor:
    def __init__(self) -> None:
        self._next: asyncio.Future | None = None  # the tick the requests now arriving wait for

    def _tick(self) -> asyncio.Future:
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            loop.call_later(0.002, self._fire)
        return self._next

    def _fire(self) -> None:
        done, self._next = self._next, None
        if done is not None:
            done.set_result(None)

    async def __call__(self, request: Request) -> Response:
        await request.body()
        await self._tick()
        return Response(ANSWER, media_type="application/json")
