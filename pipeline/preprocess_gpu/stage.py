"""PreprocessGpuCore: decode, fit on a GPU, and hand the batch on.

Two places it runs (the placement decides, not this class):

* inside the inference replica (``local=True``): a call's images are queued in a
  ``BatchScheduler`` (the one batcher; keyed by model, one batch in flight, sent at once
  when idle) so that under load the images of many calls are decoded in one nvImageCodec
  batch and fitted in one launch; the rows that come back are views of the batch, complete
  on the device, from the inference executor's own pool.
* as a deployment of its own: each call's images are fitted into one batch and sent to
  the inference replica as ``to`` says (NCCL between GPUs, the object store otherwise);
  what comes back carries the envelope instead of the data.

Decoding: JPEG on the GPU with nvImageCodec where it is installed (``preprocess.decoder``),
else -- and for PNG, and for any JPEG the GPU decoder refuses -- on CPU threads by the CPU
stage's decoder (``cpu``: at the smallest DCT scale still at least the size the fit reads,
with the CPU stage's checks and errors). Fitting is ``GpuFitter``'s (``fitter``): two-phase,
from the pool and the pinned ring. Normalization stays fused into the model's first kernel:
uint8 is half the bytes of float16 on the wire.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np

from .. import gpu_decode, metrics
from ..async_result import AsyncResult, CompletionWatcher
from ..batch_scheduler import BatchScheduler, settled
from ..batching import Batch
from ..config import PipelineConfig
from ..device import Backend, Event, Stream, select_backend
from ..errors import FerryError, ModelNotFound, QueueFull
from ..handoff import Workers
from ..imaging import encode_jpeg
from ..memory import DevicePool, PinnedRing, make_pool
from ..stages.messages import DeviceRows, Encoded, SendTo
from .fitter import GpuFitter
from .lanes import Done, Lane, Lanes
from .plan import runs_within
from .rounds import RETRY, Jpeg, Landing, landed, split_jpegs, waited
from .senders import Senders

Items = list[Encoded]  # checked by the ingress: bytes, media type, the plan of its header


class PreprocessGpuCore:
    """The stage without Serve. ``cpu`` decodes on CPU threads (the CPU stage's core built
    with ``fitted=False``); ``pool`` is the inference executor's when fused, else the
    stage makes one with the executor's limits."""

    def __init__(
        self,
        config: PipelineConfig,
        cpu: Any,
        device: int = 0,
        local: bool = False,
        pool: DevicePool | None = None,
        backend: Backend | None = None,
    ) -> None:
        self.config = config
        self.local = local
        self.backend = backend or select_backend("cupy", device, config.executor.host_wait)
        self.backend.activate()
        self.cpu = cpu
        self.targets = cpu.targets
        self.max_pixels = config.ingress.max_pixels
        first = self._decoder(config) if self.backend.is_cuda else None
        rounds = config.preprocess.decode_rounds if local else 1  # (rounds at once)
        self.gpu_pool = Workers(rounds, "ferry-pre-gpu")
        t, ex = config.transport, config.executor
        self.pool = pool or make_pool(self.backend, ex.pool_limit_bytes, ex.pool_limit_fraction)
        self.ring = PinnedRing(self.backend, t.staging_slot_bytes, t.staging_slots)
        lanes = []
        for i in range(rounds):  # each round at once its own decoder, stream, fitter, watcher
            dec = first if i == 0 else (self._decoder(config, i) if first is not None else None)
            watcher = CompletionWatcher(f"ferry-pre-done{i or ''}")  # device events -> results
            lanes.append(
                Lane(dec, *self._stream_and_fitter(f"-{i}" if i else "", watcher), watcher)
            )
        self.lanes = Lanes(lanes)
        self.scheduler: BatchScheduler | None = None
        self.senders: Senders | None = None  # (as a deployment of its own)
        if local:
            b = config.batching
            self.scheduler = BatchScheduler(
                self._run_round, config.largest_batch, 0.0, b.max_queue, max_in_flight=rounds,
                retry_after_s=b.retry_after_s, dispatch_when_idle=True,
            )  # fmt: skip
        else:
            self.senders = Senders(self.backend.device_id, t.timeout_s)
        self._last_round: asyncio.Future | None = None  # (overlap_rounds) the newest round
        self.warmup()  # (as the inference stage, always before the replica is ready)

    @property
    def decoder(self) -> Any:
        """The first lane's nvImageCodec decoder (None: JPEGs are decoded on CPU threads)."""
        return self.lanes.all[0].decoder

    @property
    def stream(self) -> Stream:
        """The first lane's stream: the warm-up's, and the decodes and sends of the stage of
        its own (one round at a time)."""
        return self.lanes.all[0].stream

    @property
    def fitter(self) -> GpuFitter:
        """The first lane's fitter (``batch``'s default)."""
        return self.lanes.all[0].fitter

    def warmup(self) -> None:
        """Fit one image per model (and decode one JPEG when nvImageCodec decodes), so the
        kernel is compiled and the decoder started before the first request: the time a
        cold first batch takes counts against the queue budget of every request behind it."""

        for model, t in self.targets.items():
            host = np.zeros((t.height + 3, t.width + 5, t.channels), np.uint8)
            imgs: list[Any] = [host]
            if self.decoder is not None:
                imgs += self.decoder.decode([encode_jpeg(host)], t.channels, self.stream)
            self.batch(model, [i for i in imgs if i is not None])
            self.stream.synchronize()

    def _stream_and_fitter(
        self, suffix: str, watcher: CompletionWatcher
    ) -> tuple[Stream, GpuFitter]:
        """A lane's stream and the fitter that enqueues on it (its copies on one more)."""
        prio = self.config.preprocess.stream_priority
        stream = Stream(f"preprocess{suffix}", self.backend, prio)
        h2d = Stream(f"preprocess-h2d{suffix}", self.backend, prio)
        timeout = self.config.transport.timeout_s
        fitter = GpuFitter(self.backend, self.pool, self.ring, stream, h2d, watcher, timeout)
        return stream, fitter

    def _decoder(self, config: PipelineConfig, lane: int = 0) -> Any:
        """nvImageCodec's JPEG decoder on this device, as ``preprocess.decoder`` asks (one
        of its own for each ``lane``)."""
        want = config.preprocess.decoder
        if want == "cpu":
            return None
        if not gpu_decode.usable("preprocess.decoder", want, "JPEGs are decoded on CPU threads"):
            return None
        pre = config.preprocess
        return gpu_decode.decoder_for(
            self.backend.device_id,
            pre.threads,
            pre.gpu_decode_backend,
            pre.gpu_decode_hw_load,
            largest=config.largest_batch if pre.gpu_decode_prime else 0,
            keep_bytes=pre.gpu_decode_keep_bytes,
            lane=lane,
        )

    async def process(self, model: str, items: Items, to: SendTo | None = None) -> DeviceRows:
        """Decode ``items`` and make the batch on the GPU. With ``to=None`` (local) the rows'
        data are device rows, complete on the device; else the batch was sent as ``to``
        says and the rows' envelope stands for it."""
        if model not in self.targets:
            raise ModelNotFound("no such model", model=model, served=sorted(self.targets))
        t0 = time.perf_counter()
        env = None
        if to is None:
            rows, owner, errors = await self._run_local(model, items)
            data: Any = rows or None
        else:
            imgs, owner, errors = await self._decode(model, items)
            data = None
            if imgs:
                env, keep, refused = await self.gpu_pool.run(self.make_and_send, model, imgs, to)
                errors.update({owner[k]: e for k, e in refused.items()})
                owner = [owner[k] for k in keep]
        ms = (time.perf_counter() - t0) * 1e3
        metrics.observe_stage("preprocess", model, ms, len(items))
        return DeviceRows(len(items), owner, errors, ms, data=data, envelope=env)

    # ------------------------------------------------------------------ local: batched
    async def _run_local(
        self, model: str, items: Items
    ) -> tuple[list[Any], list[int], dict[int, FerryError]]:
        """Each image is one item of the scheduler's next batch for ``model``; what the
        GPU decoder refuses is decoded on the CPU and queued again."""
        entries, others = self._split(model, items)
        errors: dict[int, FerryError] = {}
        found: dict[int, Any] = {}
        if others:
            await self._decode_cpu(model, items, others, found, errors)
        rows: dict[int, Any] = {}
        retry = await self._queue(model, entries + sorted(found.items()), rows, errors)
        if retry:  # the GPU decoder refused these: the CPU decodes them or says why
            again: dict[int, Any] = {}
            await self._decode_cpu(model, items, retry, again, errors)
            await self._queue(model, sorted(again.items()), rows, errors)
        owner = sorted(rows)
        return [rows[i] for i in owner], owner, errors

    async def _queue(
        self, model: str, entries: list[tuple[int, Any]], rows: dict, errors: dict
    ) -> list[int]:
        assert self.scheduler is not None
        futs = []
        for _, d in entries:
            try:
                futs.append(self.scheduler.submit_nowait(d, model))
            except QueueFull as exc:
                futs.append(asyncio.get_running_loop().create_future())
                futs[-1].set_exception(exc.with_traceback(None))  # (as InferenceStage._logits)
        done = await landed(await settled(futs))
        retry = []
        for (i, _), r in zip(entries, done, strict=True):
            if r is RETRY:
                retry.append(i)
            elif isinstance(r, FerryError):
                errors[i] = r
            elif isinstance(r, BaseException):
                errors[i] = FerryError(f"GPU preprocessing failed: {type(r).__name__}: {r}")
            else:
                rows[i] = r
        return retry

    async def _run_round(self, batch: Batch) -> list[Any]:
        """The scheduler's batch: decoded and fitted on the GPU thread; one answer per item
        (a device row, ``RETRY``, or the error of a refused image). The round ends -- and
        the scheduler may start the next -- when the GPU has finished it, or, with
        ``overlap_rounds``, once it is enqueued and the round before it is done (two rounds
        at most on the device): its rows then come as ``Landing``s."""
        datas = [p.item for p in batch.items]
        # its parts as stage metrics: decode_wait an image, decode_host (of it the thread's
        # CPU, decode_cpu, and nvImageCodec's calls, decode_call) and decode_device a round
        # (with overlap_rounds, the device's wait counts the round still before it)
        assert self.scheduler is not None
        now = self.scheduler.clock()
        waits = [(now - p.enqueued) * 1e3 for p in batch.items]
        metrics.observe_items("decode_wait", batch.key, waits)
        t0, overlap = time.perf_counter(), self.config.preprocess.overlap_rounds
        if overlap:  # the round comes back enqueued, with the Done of its device end
            answers, done_at, cpu_ms, call_ms = await self.gpu_pool.run(
                self._round, batch.key, datas
            )
            device_ms = 0.0
        else:  # the thread waits for the round's end itself (``waited``): the loop is
            # handed the round once, complete, with the ms of that wait
            answers, device_ms, cpu_ms, call_ms = await self.gpu_pool.run(
                waited, self._round, batch.key, datas
            )
        t1 = time.perf_counter()
        metrics.observe_stage("decode_host", batch.key, (t1 - t0) * 1e3 - device_ms)
        metrics.observe_stage("decode_cpu", batch.key, cpu_ms)
        if call_ms is not None:  # (a round of host images only calls no decoder)
            metrics.observe_stage("decode_call", batch.key, call_ms)
        if not overlap:
            metrics.observe_stage("decode_device", batch.key, device_ms)
            return answers
        done = asyncio.ensure_future(self._when_done(done_at, batch.key, t1))
        done.add_done_callback(lambda f: f.cancelled() or f.exception())  # (seen: no warning)
        # at most two rounds on the device: the next starts once the one before this is done
        last, self._last_round = self._last_round, done
        if last is not None and not last.done():
            await asyncio.wait([last])
        return [
            a if a is RETRY or isinstance(a, BaseException) else Landing(a, done) for a in answers
        ]

    def _round(self, model: str, datas: list[Any]) -> tuple[list, Done, float, float | None]:
        """A round's answers: its host images (decoded on the CPU) in one fit, its JPEGs in
        runs of at most ``gpu_decode_round_bytes`` decoded. A run's images are freed once
        its fit has run on the device (by the completion watcher), and a run is decoded only
        once the fit of the run two before it has: about two runs of images on the device at
        once (a third for the moment the watcher takes to let the oldest go). With them, the
        event behind the round, this thread's CPU ms over it and the ms its decoder calls
        took (None: no JPEG, no call)."""
        with self.lanes.take() as lane:  # its decoder, stream and fitter for the round
            cpu0, call_s = time.thread_time(), None
            answers: list[Any] = [RETRY] * len(datas)
            host = {j: d for j, d in enumerate(datas) if not isinstance(d, Jpeg)}
            self._fit_into(answers, model, host, lane.fitter)
            jpegs = [j for j, d in enumerate(datas) if isinstance(d, Jpeg)]
            budget = self.config.preprocess.gpu_decode_round_bytes
            fitted: list[Event] = []  # the runs' fits still on the device, oldest first
            for run in runs_within([datas[j].nbytes for j in jpegs], budget):
                which = [jpegs[k] for k in run]
                if len(fitted) == 2:
                    fitted.pop(0).synchronize()
                assert lane.decoder is not None
                c0 = time.perf_counter()
                got = lane.decoder.decode(
                    [datas[j].data for j in which], self.targets[model].channels, lane.stream
                )
                call_s = (call_s or 0.0) + time.perf_counter() - c0
                imgs = {j: g for j, g in zip(which, got, strict=True) if g is not None}
                self._fit_into(answers, model, imgs, lane.fitter)
                del got, imgs
                fitted.append(lane.stream.record())
            cpu_ms = (time.thread_time() - cpu0) * 1e3
            call_ms = None if call_s is None else call_s * 1e3
            return answers, Done(lane.stream.record(), lane.watcher), cpu_ms, call_ms

    def _fit_into(
        self, answers: list[Any], model: str, imgs: dict[int, Any], fitter: GpuFitter
    ) -> None:
        """Fit ``imgs`` (index in ``answers`` -> image) as one batch by ``fitter``: each
        gets its row or the error it was refused with."""
        if not imgs:
            return
        order = list(imgs)
        out, keep, refused = self.batch(model, [imgs[j] for j in order], fitter)
        for r, k in enumerate(keep):
            answers[order[k]] = out[r]
        for k, exc in refused.items():
            answers[order[k]] = exc

    async def _when_done(self, done: Done, model: str, since: float) -> None:
        """Wait for a round's end on the device without polling: its lane's watcher thread
        sleeps on it; the wait from ``since`` (perf_counter) is the round's ``decode_device``."""
        r: AsyncResult = AsyncResult("preprocess")
        done.watcher.watch(done.event, lambda: None, r)
        await r
        metrics.observe_stage("decode_device", model, (time.perf_counter() - since) * 1e3)

    # ------------------------------------------------------------------ decoding
    async def _decode(self, model: str, items: Items) -> tuple[list[Any], list[int], dict]:
        """JPEGs on the GPU (when there is a decoder), the rest -- and any JPEG it could not
        decode -- on CPU threads. Images come back in request order: host arrays for the CPU
        ones, nvImageCodec images (on this device, in this stage's stream) for the rest."""
        jpegs, on_cpu = self._split(model, items)
        errors: dict[int, FerryError] = {}
        channels = self.targets[model].channels
        gpu = None
        if jpegs:
            datas = [j.data for _, j in jpegs]
            gpu = self.gpu_pool.run(self.decoder.decode, datas, channels, self.stream)
        found: dict[int, Any] = {}
        if on_cpu:
            await self._decode_cpu(model, items, on_cpu, found, errors)
        if gpu is not None:
            retry = []
            for (i, _), img in zip(jpegs, await gpu, strict=True):
                if img is None:
                    retry.append(i)
                else:
                    found[i] = img
            if retry:  # the CPU decodes it, or says precisely what is wrong with it
                await self._decode_cpu(model, items, retry, found, errors)
        owner = sorted(found)
        return [found[i] for i in owner], owner, errors

    def _split(self, model: str, items: Items) -> tuple[list[tuple[int, Jpeg]], list[int]]:
        """The JPEGs for the GPU decoder (``split_jpegs`` at ``model``'s channels) and the
        indices of the rest; every index the rest without a GPU decoder. None fails here:
        the ingress checked and planned every image from its header."""
        if self.decoder is None:
            return [], list(range(len(items)))
        return split_jpegs(items, self.targets[model].channels)

    async def _decode_cpu(
        self, model: str, items: Items, which: list[int], found: dict, errors: dict
    ) -> None:
        imgs, owner, errs = await self.cpu.decode_many(model, [items[i] for i in which])
        for img, j in zip(imgs, owner, strict=True):
            found[which[j]] = img
        for j, exc in errs.items():
            errors[which[j]] = exc

    # ------------------------------------------------------------------ GPU (one thread)
    def batch(
        self, model: str, imgs: list[Any], fitter: GpuFitter | None = None
    ) -> tuple[Any, list[int], dict[int, Any]]:
        """The uint8 device batch [n, H, W, C] of decoded images (host arrays, or images on
        this device), enqueued on ``fitter``'s stream (this stage's first), in parts when
        the staging asks for it; which images it holds, row by row, and the errors of
        those refused."""
        t, fit = self.targets[model], fitter or self.fitter
        parts, refused = fit.parts(t, imgs)
        keep = [i for part in parts for i in part]
        out, lease = fit.output(t, len(keep))
        row = 0
        for part in parts:  # each part's slots are taken once the part before is enqueued
            p = fit.prepare(t, [imgs[i] for i in part], out[row : row + len(part)])
            lease.after = fit.commit(p)
            row += len(part)
        return out, keep, refused

    def make_and_send(self, model: str, imgs: list[Any], to: SendTo) -> tuple[Any, list, dict]:
        out, keep, refused = self.batch(model, imgs)
        if not keep:  # every image refused: nothing to send, each request has its error
            return None, keep, refused
        with self.stream:  # the send starts when this stream reaches it
            assert self.senders is not None  # (only the stage of its own sends)
            return self.senders.sender(to).send(out, {"model": model}), keep, refused

    def close(self) -> None:
        if self.senders is not None:
            self.senders.close()
        for lane in self.lanes.all:
            lane.stream.synchronize()
            lane.watcher.close()
        self.gpu_pool.close()
        self.ring.close()
