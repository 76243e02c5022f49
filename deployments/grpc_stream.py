"""``ModelStreamInfer``, Triton's streaming inference, a mixin of the ``Ingress`` deployment.

Ray Serve 2.60's gRPC proxy carries bidirectional streams: the proxy keeps the client's
stream, and the ingress method iterates over its requests (each fetched from the proxy by a
Ray call) while it yields answers (each sent on as it comes). Each request of a stream is a
``ModelInfer`` of its own -- the same core, coalescer, deadline and statistics
(``GrpcInference.grpc_infer``) -- and up to ``STREAM_WINDOW`` of them are read ahead of
their answers' yield, so a client that sends many before reading gets them batched together
(and a consumer that takes no answers stops the reading, instead of piling them up);
answers go back as they are done, not necessarily in order (Triton's too: a client matches
them by ``id``). A failed request is answered in the stream with its ``error_message``
(Ferry's JSON error) and the stream goes on, as Triton's does; a stream without the token is
refused whole (UNAUTHENTICATED). The deadline of the call, where it has one, is each
request's. Every answer says ``triton_final_response: true``, as Triton's last answer to a
request does (a client that asks ``enable_empty_final_response`` waits for it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from pipeline import metrics

from .grpc_service import Call

logger = logging.getLogger(__name__)
STREAM_WINDOW = 64  # requests of one stream in flight at once
FINAL = "triton_final_response"  # each request has one answer: every answer is its last


class GrpcStream:
    """Needs of the class it is mixed into: ``GrpcInference``'s (``grpc_auth``,
    ``grpc_infer``, ``_label``, ``book``, ``drain``)."""

    async def ModelStreamInfer(self, requests: Any, grpc_context: Any = None) -> AsyncIterator:
        call = Call("ModelStreamInfer", grpc_context)
        self.drain.start()
        try:
            self.grpc_auth(call)
        except Exception as exc:  # the whole stream refused: its status, raised -- a stream
            # that yields nothing never hands Serve's proxy the code set on its context, but
            # an error raised after the code is set goes back with that code and details
            metrics.count_request("", call.route, call.fail(exc).name, "grpc")
            raise
        answers: asyncio.Queue = asyncio.Queue()
        window = asyncio.Semaphore(STREAM_WINDOW)  # requests read whose answer is not yet out
        reader = asyncio.create_task(self._stream_read(requests, call, answers, window))
        try:
            while (message := await answers.get()) is not None:
                yield message
                window.release()  # (answers not taken hold their slots: no pile-up)
        finally:
            reader.cancel()

    async def _stream_read(
        self, requests: Any, call: Call, answers: asyncio.Queue, window: asyncio.Semaphore
    ) -> None:
        """Read the stream's requests while ``window`` lets it (a slot each, given back once
        its answer is out), each answered into ``answers``; None there once all are answered
        (or the stream broke)."""
        running: set[asyncio.Task] = set()

        def done(task: asyncio.Task) -> None:
            running.discard(task)
            if not task.cancelled() and task.exception() is None:
                answers.put_nowait(task.result())
            else:
                window.release()

        n = 0
        try:
            async for request in requests:
                await window.acquire()
                task = asyncio.create_task(self._stream_one(request, call.one_of_stream(n)))
                running.add(task)
                task.add_done_callback(done)
                n += 1
            while running:
                await asyncio.wait(set(running))
        except Exception:
            logger.exception("gRPC stream %s: reading its requests failed", call.request_id)
        finally:
            for task in running:
                task.cancel()
            answers.put_nowait(None)

    async def _stream_one(self, request: Any, one: Call) -> Any:
        """One request of a stream, answered as a ``ModelStreamInferResponse``."""
        model = request.model_name
        code = grpc.StatusCode.OK
        try:
            resp = await self.grpc_infer(request, one)
            metrics.observe_stage("total", model, (time.perf_counter() - one.t0) * 1e3)
            resp.parameters[FINAL].bool_param = True
            return pb.ModelStreamInferResponse(infer_response=resp)
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except Exception as exc:
            code, details, _ = one.answer_of(exc)
            if self._label(model) != "?":  # (statistics of a model served, as HTTP)
                self.book.record(model, False, (time.perf_counter() - one.t0) * 1e3, None, 0)
            resp = pb.ModelInferResponse(model_name=model, id=request.id)
            resp.parameters[FINAL].bool_param = True
            return pb.ModelStreamInferResponse(error_message=details, infer_response=resp)
        finally:
            metrics.count_request(self._label(model), one.route, code.name, "grpc")
