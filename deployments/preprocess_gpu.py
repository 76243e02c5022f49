"""PreprocessGPU: decode, resize on a GPU, and hand the batch to the inference replica --
over the transport (NCCL between GPUs, the object store otherwise) from a deployment of
its own, or in place when it runs inside the inference replica
(``fusion.preprocess_in_inference``).

As a deployment, the inference replica drives it: it calls ``run(model, items, to)`` with
its own endpoint in ``to``, so the sender knows whom to send to (a Serve handle picks the
replica, so the receiving end has to say who it is). What comes back is a ``Rows`` whose
payload is an ``Envelope``; the receiver turns it into the device batch.

Decoding: JPEG on the GPU with nvImageCodec where it is installed (``preprocess.decoder``),
else -- and for PNG, and for any JPEG the GPU decoder refuses -- on CPU threads: simplejpeg
at the smallest DCT scale still at least the size the model's fit resizes to, Pillow for
PNG, with the same checks and errors as the CPU stage. CPU-decoded images of one call are
packed into a pinned staging buffer and copied to the device in one asynchronous copy.
Every image is then fitted by its resize plan (``pipeline.resize_plan``: only the output
window is computed, with Pillow's antialiasing filter, so it agrees with the CPU stage, and
the whole resized image is never allocated, whatever the aspect ratio) into one uint8 batch
at the model's input size, one kernel launch per upload, all on the stage's stream. Normalization stays fused
into the model's first kernel on the inference GPU: uint8 is half the bytes of float16 on
the wire.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np
from ray import serve

from pipeline import metrics
from pipeline.config import PipelineConfig
from pipeline.errors import FerryError, InvalidInput, ModelNotFound
from pipeline.imaging import Target, plan_decode, plan_resize, sniff
from pipeline.threads import thread_pool

from .messages import Rows
from .preprocess import PreprocessCore

logger = logging.getLogger(__name__)


class PreprocessGpuCore:
    """The stage without Ray's Serve: decode, upload, resize, then send -- or, with
    ``local=True`` (fused into the inference replica), hand the device batch over in place."""

    def __init__(self, config: PipelineConfig, device: int = 0, local: bool = False) -> None:
        from pipeline.device import Stream, select_backend
        from pipeline.memory import PinnedRing

        self.config = config
        self.local = local
        self.backend = select_backend("cupy", device)
        self.backend.activate()
        self.cpu = PreprocessCore(config, fitted=False)  # decoding, as the CPU stage does it
        self.targets = self.cpu.targets
        self.max_pixels = config.ingress.max_pixels
        self.decoder = self._decoder(config)
        self.gpu_pool = thread_pool(1, "ferry-pre-gpu")
        t = config.transport
        self.timeout_s = t.timeout_s
        self.ring = PinnedRing(self.backend, t.staging_slot_bytes, t.staging_slots)
        self.stream = Stream("preprocess", self.backend)
        self.endpoint: Any = None
        self.os_tx: Any = None
        if not local:
            from pipeline.transport.base import nccl_available
            from pipeline.transport.object_store import ObjectStoreSender

            if nccl_available():
                from pipeline.transport.nccl import NcclEndpoint

                self.endpoint = NcclEndpoint(self.backend.device_id, timeout_s=t.timeout_s)
            self.os_tx = ObjectStoreSender("preprocess->inference")
        self._senders: dict[str, Any] = {}
        self._same_gpu_warned = False
        self._inflight: deque = deque()  # (event, slot) of uploads not yet known complete
        self._held: deque = deque()  # (event, decoded images) until the resize has read them
        from pipeline.async_result import CompletionWatcher

        self.watcher = CompletionWatcher("ferry-pre-done")  # device events -> results
        self._round_lock = threading.Lock()
        self._pending: list = []  # (model, entries, result) waiting for the next round
        self._draining = False

    def _decoder(self, config: PipelineConfig) -> Any:
        """nvImageCodec's JPEG decoder on this device, as ``preprocess.decoder`` asks."""
        want = config.preprocess.decoder
        if want == "cpu":
            return None
        from pipeline import gpu_decode

        if not gpu_decode.available():
            if want == "nvimgcodec":
                raise FerryError(
                    "preprocess.decoder is 'nvimgcodec' but nvImageCodec does not load here; "
                    "install the gpu-decode extra (pip install 'ferry[gpu-decode]')"
                )
            logger.info("nvImageCodec not installed: JPEGs are decoded on CPU threads")
            return None
        return gpu_decode.decoder_for(
            self.backend.device_id, config.preprocess.threads, config.preprocess.gpu_decode_backend
        )

    async def run(
        self, model: str, items: list[tuple[bytes, str | None]], to: dict | None = None
    ) -> Rows:
        """Decode ``items`` and make the batch on the GPU. Sent as ``to`` says, the Rows that
        come back carry the envelope instead of the data; with ``to=None`` (local) they carry
        the device batch itself, complete on the device."""
        if model not in self.targets:
            raise ModelNotFound("no such model", model=model, served=sorted(self.targets))
        if to is None and self.decoder is not None:
            return await self._run_local(model, items)
        t0 = time.perf_counter()
        imgs, owner, errors = await self._decode(model, items)
        loop = asyncio.get_running_loop()
        env = data = None
        if imgs and to is None:
            data, ready = await loop.run_in_executor(self.gpu_pool, self.make_local, model, imgs)
            await self._when_done(ready)
        elif imgs:
            env = await loop.run_in_executor(self.gpu_pool, self.make_and_send, model, imgs, to)
        ms = (time.perf_counter() - t0) * 1e3
        metrics.observe_stage("preprocess", model, ms, len(items))
        return Rows(len(items), data, owner, errors, {"preprocess": ms}, envelope=env)

    async def _when_done(self, event: Any) -> None:
        """Wait for a device event without polling: the watcher thread sleeps on it."""
        from pipeline.async_result import AsyncResult

        r: AsyncResult = AsyncResult("preprocess")
        self.watcher.watch(event, lambda: None, r)
        await r

    # ------------------------------------------------------------------ local rounds
    async def _run_local(self, model: str, items: list[tuple[bytes, str | None]]) -> Rows:
        """In the inference replica, with a GPU decoder: the call's JPEGs join the next
        *round* -- everything that arrived from every call since the last one began,
        decoded in one nvImageCodec batch and fitted in one launch by the GPU thread.
        Rounds grow with the load, like every other batch in Ferry, so the per-round cost
        (decoder call, launch, event) is paid once for many calls. The rows that come back
        are views of the round's device batch, complete on the device."""
        t0 = time.perf_counter()
        jpegs, others, errors = self._split(model, items)
        found: dict[int, Any] = {}
        if others:  # PNG and the like: CPU threads, then uploaded in the round
            await self._decode_cpu(model, items, others, found, errors)
        entries = jpegs + sorted(found.items())
        rows: list[Any] = []
        owner: list[int] = []
        if entries:
            got, got_owner, failed = await self._round(model, entries)
            rows += got
            owner += got_owner
            if failed:  # the GPU decoder refused these: the CPU decodes them or says why
                retry: dict[int, Any] = {}
                await self._decode_cpu(model, items, failed, retry, errors)
                if retry:
                    got, got_owner, _ = await self._round(model, sorted(retry.items()))
                    rows += got
                    owner += got_owner
        ms = (time.perf_counter() - t0) * 1e3
        metrics.observe_stage("preprocess", model, ms, len(items))
        return Rows(len(items), rows or None, owner, errors, {"preprocess": ms})

    def _round(self, model: str, entries: list[tuple[int, Any]]) -> Any:
        """Queue ``entries`` ((request index, JPEG bytes or a decoded host image)) for the
        next round; an awaitable of (device rows, their request indices, failed JPEGs)."""
        from pipeline.async_result import AsyncResult

        r: AsyncResult = AsyncResult("preprocess round")
        with self._round_lock:
            self._pending.append((model, entries, r))
            start = not self._draining
            self._draining = True
        if start:
            self.gpu_pool.submit(self._drain)
        return r

    def _drain(self) -> None:
        """The GPU thread: rounds, back to back, while calls keep coming."""
        while True:
            with self._round_lock:
                todo, self._pending = self._pending, []
                if not todo:
                    self._draining = False
                    return
            by_model: dict[str, list] = {}
            for req in todo:
                by_model.setdefault(req[0], []).append(req)
            for model, reqs in by_model.items():
                try:
                    self._one_round(model, reqs)
                except BaseException as exc:
                    err = exc if isinstance(exc, FerryError) else FerryError(f"{exc}")
                    for *_, r in reqs:
                        r.set_exception(err)

    def _one_round(self, model: str, reqs: list) -> None:
        t = self.targets[model]
        datas = [d for _, es, _ in reqs for _, d in es if not isinstance(d, np.ndarray)]
        decoded = iter(self.decoder.decode(datas, t.channels, self.stream))
        imgs: list[Any] = []
        spans = []
        for _, entries, r in reqs:
            start, owner, failed = len(imgs), [], []
            for i, d in entries:
                img = d if isinstance(d, np.ndarray) else next(decoded)
                if img is None:
                    failed.append(i)
                else:
                    imgs.append(img)
                    owner.append(i)
            spans.append((start, len(imgs), owner, failed, r))
        out = self.batch(model, imgs) if imgs else None
        ready = self.stream.record()
        for start, end, owner, failed, r in spans:
            rows = [] if out is None else list(out[start:end])
            self.watcher.watch(ready, lambda v=(rows, owner, failed): v, r)

    async def _decode(
        self, model: str, items: list[tuple[bytes, str | None]]
    ) -> tuple[list[Any], list[int], dict[int, FerryError]]:
        """JPEGs on the GPU (when there is a decoder), the rest -- and any JPEG it could not
        decode -- on CPU threads. Images come back in request order: host arrays for the CPU
        ones, nvImageCodec images (on this device, in this stage's stream) for the rest."""
        if self.decoder is not None:
            jpegs, on_cpu, errors = self._split(model, items)
            on_gpu = [i for i, _ in jpegs]
        else:
            on_gpu, on_cpu, errors = [], list(range(len(items))), {}
        loop = asyncio.get_running_loop()
        channels = self.targets[model].channels
        gpu = None
        if on_gpu:
            datas = [items[i][0] for i in on_gpu]
            gpu = loop.run_in_executor(self.gpu_pool, self._decode_gpu, datas, channels)
        found: dict[int, Any] = {}
        if on_cpu:
            await self._decode_cpu(model, items, on_cpu, found, errors)
        if gpu is not None:
            decoded = await gpu
            retry = []
            for i, img in zip(on_gpu, decoded, strict=True):
                if img is None:
                    retry.append(i)
                else:
                    found[i] = img
            if retry:  # the CPU decodes it, or says precisely what is wrong with it
                await self._decode_cpu(model, items, retry, found, errors)
        owner = sorted(found)
        return [found[i] for i in owner], owner, errors

    def _split(
        self, model: str, items: list[tuple[bytes, str | None]]
    ) -> tuple[list[tuple[int, bytes]], list[int], dict[int, FerryError]]:
        """JPEGs for the GPU decoder (checked and planned from their headers: media type,
        pixel count, the resize plan's bounds), the indices of everything else (for the CPU
        path), and the JPEGs that failed."""
        target = self.targets[model]
        errors: dict[int, FerryError] = {}
        jpegs: list[tuple[int, bytes]] = []
        others: list[int] = []
        for i, (data, ct) in enumerate(items):
            if sniff(data) != "jpeg":
                others.append(i)
                continue
            try:
                plan_decode(data, ct, target, self.max_pixels, self.cpu.max_work_bytes)
            except FerryError as exc:
                errors[i] = exc
                continue
            jpegs.append((i, data))
        return jpegs, others, errors

    async def _decode_cpu(
        self,
        model: str,
        items: list[tuple[bytes, str | None]],
        which: list[int],
        found: dict[int, Any],
        errors: dict[int, FerryError],
    ) -> None:
        imgs, owner, errs = await self.cpu.decode_many(model, [items[i] for i in which])
        for img, j in zip(imgs, owner, strict=True):
            found[which[j]] = img
        for j, exc in errs.items():
            errors[which[j]] = exc

    # ------------------------------------------------------------------ GPU (one thread)
    def _decode_gpu(self, datas: list[bytes], channels: int) -> list[Any]:
        return self.decoder.decode(datas, channels, self.stream)

    def batch(self, model: str, imgs: list[Any]) -> Any:
        """The uint8 device batch [n, H, W, C] of decoded images -- host arrays, or images
        already on this device -- enqueued on this stage's stream (the caller sends it from
        there or waits for the stream)."""
        import cupy

        t = self.targets[model]
        n = len(imgs)
        with self.stream:
            out = cupy.empty((n, t.height, t.width, t.channels), dtype=cupy.uint8)
            held = [(j, img) for j, img in enumerate(imgs) if not isinstance(img, np.ndarray)]
            if held:  # decoded on the GPU: all of them fitted in one launch
                self._fit_many(held, out, t)
            i = 0
            while i < n:
                if not isinstance(imgs[i], np.ndarray):
                    i += 1
                    continue
                if imgs[i].nbytes > self.ring.slot_bytes:  # rare: a huge PNG; pageable copy
                    big = cupy.asarray(imgs[i])
                    self._fit_many([(i, big)], out, t)
                    self._held.append((self.stream.record(), big))
                    i += 1
                    continue
                self._reap()  # a slot back from an upload that finished
                slot = self.ring.acquire(self.timeout_s)
                placed, off = [], 0
                while (
                    i < n
                    and isinstance(imgs[i], np.ndarray)
                    and off + imgs[i].nbytes <= self.ring.slot_bytes
                ):
                    img = np.ascontiguousarray(imgs[i])
                    slot.view(off, img.shape, np.uint8)[...] = img
                    placed.append((i, off, img.shape))
                    off += -(-img.nbytes // 256) * 256
                    i += 1
                dev = cupy.empty(off, dtype=cupy.uint8)
                self.stream.copy_h2d(dev, slot.view(0, (off,), np.uint8))
                self._inflight.append((self.stream.record(), slot))
                # the slot's images fitted in one launch, read in place from the upload
                self._fit_many(
                    [(j, dev[o : o + int(np.prod(sh))].reshape(sh)) for j, o, sh in placed],
                    out,
                    t,
                )
            while self._held and self._held[0][0].done():
                self._held.popleft()
            if held:  # nvImageCodec's images live until the resize has read them
                self._held.append((self.stream.record(), held))
        return out

    def _fit_many(self, rows: list[tuple[int, Any]], out: Any, t: Target) -> None:
        """Fit device images (``(output row, image)``) into ``out`` with one kernel launch;
        their geometry goes to the device through a pinned staging slot."""
        import cupy

        from pipeline.ops.image import GEO_FIELDS, resize_crop_many

        n = len(rows)
        ptrs = np.empty(n, np.uint64)
        geo = np.empty((n, GEO_FIELDS), np.int32)
        scale = np.empty((n, 2), np.float32)
        keep = []
        for k, (j, img) in enumerate(rows):
            v = device_view(img)
            if v.ndim == 2:
                v = v[..., None]
            h, w, c = v.shape
            if c != t.channels:
                raise InvalidInput("decoded image has the wrong channel count", channels=c)
            if v.strides[1:] != (c, 1):  # the kernel takes a row pitch, not pixel strides
                v = cupy.ascontiguousarray(v)
                keep.append(v)
            p = plan_resize(h, w, t)  # only the output window is computed: no intermediate
            geo[k] = (h, w, v.strides[0], p.resized_h, p.resized_w, p.top, p.left, j)
            scale[k] = p.scale
            ptrs[k] = v.data.ptr
        parts = (ptrs, geo, scale)
        offs, size = [], 0
        for a in parts:
            offs.append(size)
            size += -(-a.nbytes // 256) * 256
        self._reap()
        slot = self.ring.acquire(self.timeout_s)
        for a, o in zip(parts, offs, strict=True):
            slot.view(o, (a.nbytes,), np.uint8)[...] = a.view(np.uint8).reshape(-1)
        dev = cupy.empty(size, dtype=cupy.uint8)
        self.stream.copy_h2d(dev, slot.view(0, (size,), np.uint8))
        self._inflight.append((self.stream.record(), slot))
        d = [dev[o : o + a.nbytes].view(a.dtype) for a, o in zip(parts, offs, strict=True)]
        resize_crop_many(d[0], d[1], d[2], out, n)
        if keep:  # the dense copies live until the kernel has read them
            self._held.append((self.stream.record(), keep))

    def make_local(self, model: str, imgs: list[Any]) -> tuple[Any, Any]:
        """The device batch and the event that marks it complete on this stage's stream."""
        out = self.batch(model, imgs)
        return out, self.stream.record()

    def make_and_send(self, model: str, imgs: list[np.ndarray], to: dict) -> Any:
        out = self.batch(model, imgs)
        with self.stream:  # the send starts when this stream reaches it
            return self._sender(to).send(out, {"model": model})

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
        self.watcher.close()
        self._held.clear()
        self.ring.close()


def device_view(img: Any) -> Any:
    """A cupy view of a device image that exposes ``__cuda_array_interface__``, without
    the stream synchronization cupy would do on import (the image is in stream order on
    the stage's stream already); the view keeps the image alive."""
    import cupy

    cai = img.__cuda_array_interface__
    ptr = int(cai["data"][0])
    shape = tuple(cai["shape"])
    dtype = np.dtype(cai["typestr"])
    strides = cai.get("strides")
    size = (
        int(np.prod(shape)) * dtype.itemsize
        if strides is None
        else (sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + dtype.itemsize)
    )
    mem = cupy.cuda.UnownedMemory(ptr, size, img)
    return cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(mem, 0), strides=strides)


@serve.deployment
class PreprocessGPU:
    def __init__(self, config: dict[str, Any]) -> None:
        cfg = PipelineConfig.model_validate(config)
        cfg.preprocess_deployment.apply_in_process()
        self.core = PreprocessGpuCore(cfg)

    async def __call__(self, model: str, items: list[tuple[bytes, str | None]], to: dict) -> Rows:
        return await self.core.run(model, items, to)
