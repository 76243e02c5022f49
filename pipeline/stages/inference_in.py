"""The receiving end of the GPU preprocess hop (``gpu_preprocess``): where PreprocessGPU
sends the inference stage its decoded batches -- over NCCL when both ends hold CUDA devices
and NCCL loads, through the object store otherwise."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pipeline.handoff import Workers
from pipeline.transport.base import choose_transport
from pipeline.transport.nccl import NcclEndpoint
from pipeline.transport.object_store import ObjectStoreReceiver

from .messages import SendTo

logger = logging.getLogger("pipeline.stages.inference")


class BatchReceiver:
    """``to``: what the stage tells PreprocessGPU (how to send); ``recv``: a batch."""

    def __init__(self, backend: Any, timeout_s: float) -> None:

        cuda = backend.is_cuda
        kind = choose_transport("auto", True, cuda)
        self.timeout_s = timeout_s
        self.endpoint: Any = None
        self.receivers: dict[str, Any] = {
            "object_store": ObjectStoreReceiver("preprocess->inference", cuda)
        }
        self.to = SendTo(kind)
        if kind == "nccl":
            self.endpoint = NcclEndpoint(backend.device_id, timeout_s=timeout_s)
            self.receivers["nccl"] = self.endpoint.receiver("preprocess->inference")
            self.to = SendTo(kind, self.endpoint.id, self.endpoint.gpu)
        self.pool = Workers(4, "ferry-recv")
        logger.info("GPU preprocessing hands batches over by %s", kind)

    async def recv(self, envelope: Any) -> Any:
        """The batch an envelope stands for. NCCL receives are posted from a thread and
        polled from here: one waiting for an earlier envelope never holds a thread."""
        rx = self.receivers[envelope.transport]
        if envelope.transport != "nccl":
            data, _ = await self.pool.run(rx.recv, envelope, self.timeout_s)
            return data
        posted = await self.pool.run(rx.post, [envelope], self.timeout_s)
        pause = 5e-5
        while not posted.done():
            await asyncio.sleep(pause)
            pause = min(pause * 2, 1e-3)
        return posted.wait()[0][0]
