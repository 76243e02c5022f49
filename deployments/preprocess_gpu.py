"""PreprocessGPU: decode on CPU threads, resize on this replica's GPU, and hand the batch to
the inference replica over the transport (NCCL between GPUs, the object store otherwise).

The inference replica drives it: it calls ``run(model, items, to)`` with its own endpoint
in ``to``, so the sender knows whom to send to (a Serve handle picks the replica, so the
receiving end has to say who it is). What comes back is a ``Rows`` whose payload is an
``Envelope``; the receiver turns it into the device batch.

Decoding: JPEG through simplejpeg at the smallest DCT scale still at least the size the
model's fit resizes to, PNG through Pillow -- the same checks and errors as the CPU stage.
The decoded images of one call are packed into a pinned staging buffer, copied to the
device in one asynchronous copy, resized (the runtime's ``resize_bilinear`` kernel with
Pillow's antialiasing filter, so it agrees with the CPU stage) and centre-cropped into one
uint8 batch at the model's input size. Normalization
stays fused into the model's first kernel on the inference GPU: uint8 is half the bytes
of float16 on the wire.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from ray import serve

from pipeline import metrics
from pipeline.config import PipelineConfig
from pipeline.errors import InvalidInput, ModelNotFound
from pipeline.imaging import Target, resize_to

from .messages import Rows
from .preprocess import PreprocessCore

logger = logging.getLogger(__name__)


class PreprocessGpuCore:
    """The stage without Ray's Serve: decode, upload, resize, send."""

    def __init__(self, config: PipelineConfig, device: int = 0) -> None:
        from pipeline.device import Stream, select_backend
        from pipeline.memory import PinnedRing
        from pipeline.ops.image import ResizeBilinear
        from pipeline.transport.base import nccl_available
        from pipeline.transport.object_store import ObjectStoreSender

        self.config = config
        self.backend = select_backend("cupy", device)
        self.backend.activate()
        self.cpu = PreprocessCore(config, fitted=False)  # decoding, as the CPU stage does it
        self.targets = self.cpu.targets
        self.gpu_pool = ThreadPoolExecutor(1, thread_name_prefix="ferry-pre-gpu")
        t = config.transport
        self.timeout_s = t.timeout_s
        self.ring = PinnedRing(self.backend, t.staging_slot_bytes, t.staging_slots)
        self.stream = Stream("preprocess", self.backend)
        self.resize = ResizeBilinear()
        self.endpoint: Any = None
        if nccl_available():
            from pipeline.transport.nccl import NcclEndpoint

            self.endpoint = NcclEndpoint(self.backend.device_id, timeout_s=t.timeout_s)
        self.os_tx = ObjectStoreSender("preprocess->inference")
        self._senders: dict[str, Any] = {}
        self._same_gpu_warned = False
        self._inflight: deque = deque()  # (event, slot) of uploads not yet known complete

    async def run(self, model: str, items: list[tuple[bytes, str | None]], to: dict) -> Rows:
        """Decode ``items``, make the batch on the GPU, send it as ``to`` says; the Rows
        that come back carry the envelope instead of the data."""
        if model not in self.targets:
            raise ModelNotFound("no such model", model=model, served=sorted(self.targets))
        t0 = time.perf_counter()
        imgs, owner, errors = await self.cpu.decode_many(model, items)
        env = None
        if imgs:
            loop = asyncio.get_running_loop()
            env = await loop.run_in_executor(self.gpu_pool, self.make_and_send, model, imgs, to)
        ms = (time.perf_counter() - t0) * 1e3
        metrics.observe_stage("preprocess", model, ms)
        return Rows(len(items), None, owner, errors, {"preprocess": ms}, envelope=env)

    # ------------------------------------------------------------------ GPU (one thread)
    def batch(self, model: str, imgs: list[np.ndarray]) -> Any:
        """The uint8 device batch [n, H, W, C] of decoded images, enqueued on this stage's
        stream (the caller sends it from there or synchronizes)."""
        import cupy

        t = self.targets[model]
        n = len(imgs)
        with self.stream:
            out = cupy.empty((n, t.height, t.width, t.channels), dtype=cupy.uint8)
            i = 0
            while i < n:
                if imgs[i].nbytes > self.ring.slot_bytes:  # rare: a huge PNG; pageable copy
                    self._fit(cupy.asarray(imgs[i]), out[i], t)
                    i += 1
                    continue
                self._reap()  # a slot back from an upload that finished
                slot = self.ring.acquire(self.timeout_s)
                placed, off = [], 0
                while i < n and off + imgs[i].nbytes <= self.ring.slot_bytes:
                    img = np.ascontiguousarray(imgs[i])
                    slot.view(off, img.shape, np.uint8)[...] = img
                    placed.append((i, off, img.shape))
                    off += -(-img.nbytes // 256) * 256
                    i += 1
                dev = cupy.empty(off, dtype=cupy.uint8)
                self.stream.copy_h2d(dev, slot.view(0, (off,), np.uint8))
                self._inflight.append((self.stream.record(), slot))
                for j, o, shape in placed:
                    size = int(np.prod(shape))
                    self._fit(dev[o : o + size].reshape(shape), out[j], t)
        return out

    def make_and_send(self, model: str, imgs: list[np.ndarray], to: dict) -> Any:
        out = self.batch(model, imgs)
        with self.stream:  # the send starts when this stream reaches it
            return self._sender(to).send(out, {"model": model})

    def _fit(self, src: Any, dst: Any, t: Target) -> None:
        """Resize one device image [h, w, c] into ``dst`` [H, W, C] as ``imaging.fit`` does."""
        import cupy

        from pipeline.ops.base import TensorSpec

        h, w, c = src.shape
        rh, rw = resize_to(h, w, t)
        if (h, w) == (rh, rw):
            tmp = src[None]
        else:
            plan = self.resize.prepare(
                TensorSpec((1, h, w, c), "uint8"), size=(rh, rw), antialias=True
            )
            tmp = dst[None] if t.fit == "stretch" else cupy.empty((1, rh, rw, c), cupy.uint8)
            self.resize.commit(plan, [src[None]], [tmp], None, self.stream)
            if t.fit == "stretch":
                return
        top, left = (rh - t.height) // 2, (rw - t.width) // 2
        dst[...] = tmp[0, top : top + t.height, left : left + t.width]

    def _reap(self) -> None:
        while self._inflight and self._inflight[0][0].done():
            _, slot = self._inflight.popleft()
            slot.release()
        if len(self._inflight) >= self.ring.slots:  # all slots out: wait for the oldest
            ev, slot = self._inflight.popleft()
            ev.synchronize()
            slot.release()

    def _sender(self, to: dict) -> Any:
        kind = to.get("transport")
        if kind == "object_store":
            return self.os_tx
        if kind != "nccl":
            raise InvalidInput("unknown transport", transport=kind)
        if self.endpoint is None:
            from pipeline.errors import TransportError

            raise TransportError("NCCL is not available in this preprocess replica")
        if to.get("gpu") == self.endpoint.gpu:  # both replicas share this GPU: NCCL can't
            if not self._same_gpu_warned:
                self._same_gpu_warned = True
                logger.warning(
                    "preprocess and inference share GPU %s; NCCL needs two devices, "
                    "so batches go by the object store",
                    self.endpoint.gpu,
                )
            return self.os_tx
        dst = to["endpoint"]
        s = self._senders.get(dst)
        if s is None:
            s = self._senders[dst] = self.endpoint.sender(dst, "preprocess->inference")
        return s

    def close(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
        self.stream.synchronize()
        self.ring.close()


@serve.deployment
class PreprocessGPU:
    def __init__(self, config: dict[str, Any]) -> None:
        self.core = PreprocessGpuCore(PipelineConfig.model_validate(config))

    async def __call__(self, model: str, items: list[tuple[bytes, str | None]], to: dict) -> Rows:
        return await self.core.run(model, items, to)
