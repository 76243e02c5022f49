"""Senders: where the GPU preprocess stage, as a deployment of its own, sends a fitted batch.

``SendTo`` names the way: the object store, or NCCL to the inference replica's endpoint (one
sender a destination, made at its first batch). Two replicas on one GPU cannot use NCCL, so
their batches go by the object store, with a warning once.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import InvalidInput, TransportError
from ..stages.messages import SendTo
from ..transport.base import nccl_available
from ..transport.nccl import NcclEndpoint
from ..transport.object_store import ObjectStoreSender

logger = logging.getLogger(__name__)
WHAT = "preprocess->inference"


class Senders:
    """This replica's NCCL endpoint on ``device_id`` (None where NCCL is not available), its
    object-store sender, and a sender for each NCCL destination."""

    def __init__(self, device_id: int, timeout_s: float) -> None:
        self.endpoint: Any = (
            NcclEndpoint(device_id, timeout_s=timeout_s) if nccl_available() else None
        )
        self.os_tx = ObjectStoreSender(WHAT)
        self._by_dst: dict[str, Any] = {}
        self._same_gpu_warned = False

    def sender(self, to: SendTo) -> Any:
        """The sender for ``to``, or ``InvalidInput`` (an unknown transport) /
        ``TransportError`` (NCCL asked for where there is none)."""
        kind = to.transport
        if kind == "object_store":
            return self.os_tx
        if kind != "nccl":
            raise InvalidInput("unknown transport", transport=kind)
        if self.endpoint is None:
            raise TransportError("NCCL is not available in this preprocess replica")
        if to.gpu == self.endpoint.gpu:  # both replicas share this GPU: NCCL can't
            if not self._same_gpu_warned:
                self._same_gpu_warned = True
                logger.warning(
                    "preprocess and inference share GPU %s; NCCL needs two devices, "
                    "so batches go by the object store",
                    self.endpoint.gpu,
                )
            return self.os_tx
        dst = to.endpoint
        s = self._by_dst.get(dst)
        if s is None:
            s = self._by_dst[dst] = self.endpoint.sender(dst, WHAT)
        return s

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
