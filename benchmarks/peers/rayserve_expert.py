"""The expert Ray Serve app: the classifier as a strong Ray Serve user writes it (issue 28).

One deployment behind Serve's HAProxy ingress, ``replicas`` replicas sharing the GPU
(``num_gpus = 1 / replicas``). A replica batches requests with
``@serve.batch(max_batch_size=128, batch_wait_timeout_s=0.004, max_concurrent_batches=2)``
and admits ``max_ongoing_requests = 3 x 128`` (Serve's default is 5 a replica: with it no
batch could pass 5). Each batch:

1. is decoded on the GPU in one call (``torchvision.io.decode_jpeg(list, device="cuda")``,
   nvJPEG's batched hardware decode), into memory of a stream of its own (below);
2. each group of same-sized images is resized to 256 on the shorter side (bilinear,
   antialiased, as torchvision's ``Resize(256)``), its centre 224x224 cropped and normalised,
   straight into consecutive rows of the static fp16 channels-last input of the batch's
   padded size -- no index tensor, so no host copy and no wait: the rows' order (``order``)
   stays on the host;
3. runs torchvision's ResNet-50 in fp16 through ``torch.compile(mode="reduce-overhead")``
   with inductor's freezing: a CUDA graph per padded batch size (8, 32, 128);
4. takes softmax and top 5 on the GPU, and sends them to the host in one asynchronous copy
   (values and classes in one tensor, into pinned memory), with an event behind it.

The GPU work is launched from one thread of the replica's own (CUDA graph trees are per
thread), and the batch is then waited for on another, on an event that sleeps: the launch
thread takes the next batch while this one runs (two batches in flight), and the event loop
keeps reading requests throughout. The answer is the top 5 as JSON (``orjson``), the same
content as Ferry's classify route: ``{"top_k": [{"label", "class", "score"}, ...]}``.

What it does not waste: torch's intra-op CPU threads (one a replica, ``threads``: the
default of one a core, times 8 replicas, kept ~1 core a replica busy), spinning waits (the
replica's CUDA context sleeps on every host wait, torchvision's nvJPEG stream syncs
included: ``sleep_on_sync``), and host syncs within a batch (one: its answer).

torchvision's nvJPEG decoder writes on a private stream that does not wait for the caller's
(pytorch/vision#8587): its outputs are allocated on a stream of this core's own, so they never
reuse memory that the previous batch's kernels may still read (the caching allocator reuses
a block only on the stream it was allocated on), and each image is marked as used on the
main stream (``record_stream``) so its memory waits for those kernels in turn.

    import_path: benchmarks.peers.rayserve_expert:build_app   args: {replicas: 8}

``args`` beside ``replicas``: ``threads`` (1; None keeps torch's default), ``blocking``
(True: sleeping waits; False: spin, as CUDA's default), ``pipelined`` (True: two batches in
flight; False: a batch's launch and wait on the one GPU thread, one at a time),
``context_sleep`` (True: with ``blocking``, every host wait of the replica's CUDA context
sleeps, nvJPEG's own syncs included; False: only the batch's event wait sleeps, as in
the 2026-12-03 ``_t1_block`` form, which served photos at 2,098 img/s one batch at a time),
``decoder`` (``torchvision``; ``nvimgcodec``: NVIDIA's nvImageCodec, which Ferry uses too;
``expert_decoders.py``) -- ``blocking=False, threads=None, pipelined=False`` is the peer as
first committed (weak).

The weights are random (``weights=None``), as in the usual app: the same work either way.
Start with ``RAY_SERVE_ENABLE_HA_PROXY=1`` (bench_e2e sets it, and Serve's throughput mode).
Nothing here imports torch until a replica starts, so the module loads on a CPU-only machine.
"""

from __future__ import annotations

import asyncio
import ctypes
import fcntl
import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from benchmarks.peers.expert_decoders import DECODERS, NvImageCodecDecoder, decode_on_gpu

try:  # the answers' JSON: orjson where installed (Ferry's dependency), else the stdlib's
    from orjson import dumps as _dumps
except ImportError:  # pragma: no cover - orjson is a Ferry dependency

    def _dumps(obj: Any) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()


BUCKETS = (8, 32, 128)
"""Padded batch sizes, one CUDA graph each; the largest is the batch limit."""
WAIT_S = 0.004
CONCURRENT_BATCHES = 2
"""Batches in flight in a replica: one launching while the other runs on the GPU."""
MAX_ONGOING = (CONCURRENT_BATCHES + 1) * BUCKETS[-1]
"""A replica's admitted requests: the batches in flight and a full one forming."""
TOP_K = 5
SHORT_SIDE, CROP = 256, 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BAD = {"error": "not a JPEG the GPU decoder reads"}
BAD_JSON = _dumps(BAD)


def bucket_of(n: int, buckets: tuple[int, ...] = BUCKETS) -> int:
    """The smallest padded batch size that holds ``n`` images."""
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"a batch of {n} is over the largest bucket {buckets[-1]}")


def resized_size(h: int, w: int, short: int = SHORT_SIDE) -> tuple[int, int]:
    """(height, width) with the shorter side scaled to ``short``, the aspect kept (as
    torchvision's ``Resize(256)``)."""
    if h <= w:
        return short, max(short, int(short * w / h))
    return max(short, int(short * h / w)), short


def size_groups(shapes: list[tuple[int, int] | None]) -> dict[tuple[int, int], list[int]]:
    """The indices of each distinct (height, width), in first-seen order; None (an image
    that did not decode) is in no group."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(shapes):
        if s is not None:
            groups.setdefault(s, []).append(i)
    return groups


def answers(rows: list[list[float]], order: list[int], n: int, labels: list[str]) -> list[dict]:
    """The ``n`` answers of a batch: ``rows[r]`` (the top k scores, then their classes, as
    the GPU packed them) is the answer of image ``order[r]``; an image in no row did not
    decode (``BAD``)."""
    out: list[dict] = [BAD] * n
    for row, i in zip(rows, order, strict=True):
        k = len(row) // 2
        out[i] = {
            "top_k": [
                {"label": labels[int(c)], "class": int(c), "score": v}
                for v, c in zip(row[:k], row[k:], strict=True)
            ]
        }
    return out


def encoded(answers_: list[dict]) -> list[tuple[int, bytes]]:
    """Each answer as (HTTP status, JSON body)."""
    return [(400, BAD_JSON) if a is BAD else (200, _dumps(a)) for a in answers_]


def sleep_on_sync(ordinal: int = 0) -> bool:
    """Make every host wait on device ``ordinal`` in this process sleep instead of spin:
    its primary CUDA context gets ``CU_CTX_SCHED_BLOCKING_SYNC`` (as
    ``cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync)``), torchvision's nvJPEG stream
    syncs included. Call it before CUDA starts in the process. False, with nothing changed,
    where there is no driver or it refuses."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    try:
        set_flags = cuda.cuDevicePrimaryCtxSetFlags_v2
    except AttributeError:
        set_flags = cuda.cuDevicePrimaryCtxSetFlags
    dev = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(dev), ordinal) != 0:
        return False
    return set_flags(dev, ctypes.c_uint(0x04)) == 0  # CU_CTX_SCHED_BLOCKING_SYNC


@dataclass
class Pending:
    """A batch launched on the GPU: its size, the rows' images (``order``), the host tensor
    its top k arrive in and the event behind that copy (None: already there)."""

    n: int
    order: list[int]
    host: Any = None
    done: Any = None


class ExpertCore:
    """The replica's work without Serve: JPEG bodies in, top-5 classes out. ``submit``
    launches a batch (on the thread that built the core: CUDA graph trees are per thread),
    ``finish`` waits for it and answers (on any thread)."""

    def __init__(
        self,
        buckets: tuple[int, ...] = BUCKETS,
        compile: bool = True,
        threads: int | None = 1,
        blocking: bool = True,
        decoder: str = "torchvision",
    ) -> None:
        """``decoder``: ``torchvision`` or ``nvimgcodec`` (``expert_decoders``);
        ``threads``: torch's intra-op CPU threads (``torch.set_num_threads``; None keeps
        torch's default, one per core); ``blocking``: wait for a batch on an event that
        sleeps (``torch.cuda.Event(blocking=True)``) after an asynchronous copy, rather than
        in a synchronous copy's spin-wait."""
        import torch
        import torchvision

        self.torch = torch
        self.buckets = tuple(buckets)
        self.blocking = blocking
        if threads is not None:
            torch.set_num_threads(threads)
        torch.backends.cudnn.benchmark = True
        model = torchvision.models.resnet50(weights=None).eval().half().cuda()
        model = model.to(memory_format=torch.channels_last)
        if compile:
            import torch._inductor.config as inductor

            inductor.freezing = True  # weights as constants: batch norm folded into the convs
            model = torch.compile(model, mode="reduce-overhead", dynamic=False)
        self.model = model
        self.compiled = compile
        self.labels = torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"]
        self.mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
        self.inv_std = 1 / (torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255)
        # decoded images are allocated here, apart from the main stream's memory (the module
        # docstring says why)
        self.decode_stream = torch.cuda.Stream()
        if decoder not in DECODERS:
            raise ValueError(f"decoder must be one of {DECODERS}, got {decoder!r}")
        self.nvimgcodec = NvImageCodecDecoder(torch) if decoder == "nvimgcodec" else None
        # one static input per bucket: the CUDA graph of that size reads from it
        self.inputs = {
            b: torch.zeros((b, 3, CROP, CROP), device="cuda", dtype=torch.float16).to(
                memory_format=torch.channels_last
            )
            for b in self.buckets
        }
        self._warm_once()

    def _warm_once(self) -> None:
        """Compile and capture every bucket. Replicas start together: the first compiles
        alone and fills inductor's on-disk cache, the others then load from it."""
        marker = os.path.join(
            os.environ.get("TMPDIR", "/tmp"),
            # (an uncompiled core -- bench_decode's -- must not tell compiled replicas that
            # inductor's cache is warm)
            f"ferry-expert-{self.torch.__version__}-{'-'.join(map(str, self.buckets))}"
            f"{'' if self.compiled else '-eager'}.warm",
        )
        with open(marker + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            first = not os.path.exists(marker)
            if first:
                self._warm()
                open(marker, "w").close()
        if not first:
            self._warm()

    def _warm(self) -> None:
        torch = self.torch
        for b in self.buckets:
            for _ in range(3):  # reduce-overhead records its graph on a later call
                self._run(b)
        # and the whole path once: nvJPEG's decoder, the resize kernels, the host copy
        from torchvision.io import encode_jpeg  # optional: torchvision

        grey = torch.full((3, 300, 451), 128, dtype=torch.uint8)
        self.classify([encode_jpeg(grey).numpy().tobytes()])
        torch.cuda.synchronize()

    def _run(self, bucket: int) -> Any:
        torch = self.torch
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()  # the last batch's outputs are read
            return self.model(self.inputs[bucket])

    def _decode(self, bodies: list[bytes]) -> list[Any]:
        """The batch's images on the GPU, ready for the main stream's kernels."""
        torch = self.torch
        if self.nvimgcodec is not None:  # its own stream and ordering (expert_decoders)
            return self.nvimgcodec(bodies)
        main = torch.cuda.current_stream()
        with torch.cuda.stream(self.decode_stream):
            images = decode_on_gpu(torch, bodies)
        main.wait_stream(self.decode_stream)
        for img in images:
            if img is not None:  # its memory is reused only once the main stream is past it
                img.record_stream(main)
        return images

    def _fill(self, images: list[Any], x: Any) -> list[int]:
        """Resize (antialiased), crop and normalise the images into consecutive rows of
        ``x``, one resize per group of same-sized images; returns ``order``: row ``r`` holds
        ``images[order[r]]`` (a None image has no row)."""
        torch = self.torch
        order: list[int] = []
        shapes = [None if img is None else (int(img.shape[1]), int(img.shape[2])) for img in images]
        for (h, w), idx in size_groups(shapes).items():
            if len(idx) == 1:
                batch = images[idx[0]].unsqueeze(0)
            else:
                batch = torch.stack([images[i] for i in idx])
            rh, rw = resized_size(h, w)
            batch = torch.nn.functional.interpolate(
                batch.float(), size=(rh, rw), mode="bilinear", antialias=True, align_corners=False
            )
            top, left = (rh - CROP) // 2, (rw - CROP) // 2
            crop = batch[:, :, top : top + CROP, left : left + CROP]
            row = len(order)
            x[row : row + len(idx)].copy_(crop.sub_(self.mean).mul_(self.inv_std))
            order += idx
        return order

    def top_k(self, logits: Any) -> Any:
        """The rows' top k scores then their classes, in one tensor on the device (one copy
        to the host: classes below 2**24 are exact as floats)."""
        torch = self.torch
        with torch.no_grad():
            vals, idx = logits.float().softmax(dim=1).topk(TOP_K, dim=1)
            return torch.cat([vals, idx.float()], dim=1)

    def submit(self, bodies: list[bytes]) -> Pending:
        """Launch a batch: decode, preprocess, the model and its top k, the copy to the
        host. Waits for nothing on the GPU but nvJPEG's own decode."""
        torch = self.torch
        n = len(bodies)
        bucket = bucket_of(n, self.buckets)
        order = self._fill(self._decode(bodies), self.inputs[bucket])
        if not order:  # nothing decoded: no model
            return Pending(n, order)
        packed = self.top_k(self._run(bucket)[: len(order)])
        if not self.blocking:
            return Pending(n, order, packed.cpu())  # the copy's spin-wait for the batch
        host = packed.to("cpu", non_blocking=True)  # pinned memory, no wait
        done = torch.cuda.Event(blocking=True)
        done.record()
        return Pending(n, order, host, done)

    def finish(self, p: Pending) -> list[dict[str, Any]]:
        """Wait for a launched batch (asleep) and answer each of its images."""
        if p.done is not None:
            p.done.synchronize()
        rows = [] if p.host is None else p.host.tolist()
        return answers(rows, p.order, p.n, self.labels)

    def classify(self, bodies: list[bytes]) -> list[dict[str, Any]]:
        return self.finish(self.submit(bodies))


@serve.deployment
class ExpertClassifier:
    def __init__(
        self,
        threads: int | None = 1,
        blocking: bool = True,
        pipelined: bool = True,
        context_sleep: bool = True,
        decoder: str = "torchvision",
    ) -> None:
        if blocking and context_sleep:
            sleep_on_sync()  # before CUDA starts in this replica
        self.pipelined = pipelined
        self.gpu = ThreadPoolExecutor(1, thread_name_prefix="expert-gpu")  # one thread: CUDA graphs
        self.waits = ThreadPoolExecutor(CONCURRENT_BATCHES, thread_name_prefix="expert-wait")
        self.core = self.gpu.submit(
            lambda: ExpertCore(threads=threads, blocking=blocking, decoder=decoder)
        ).result()

    def _finish(self, p: Pending) -> list[tuple[int, bytes]]:
        return encoded(self.core.finish(p))

    def _serial(self, bodies: list[bytes]) -> list[tuple[int, bytes]]:
        return encoded(self.core.classify(bodies))

    @serve.batch(
        max_batch_size=BUCKETS[-1],
        batch_wait_timeout_s=WAIT_S,
        max_concurrent_batches=CONCURRENT_BATCHES,
    )
    async def classify(self, bodies: list[bytes]) -> list[tuple[int, bytes]]:
        loop = asyncio.get_running_loop()
        if not self.pipelined:  # launch and wait on the GPU thread: one batch at a time
            return await loop.run_in_executor(self.gpu, self._serial, bodies)
        pending = await loop.run_in_executor(self.gpu, self.core.submit, bodies)
        return await loop.run_in_executor(self.waits, self._finish, pending)

    async def __call__(self, request: Request) -> Response:
        status, body = await self.classify(await request.body())
        return Response(body, status_code=status, media_type="application/json")


def build_app(args: dict[str, Any]) -> serve.Application:
    """``args``: ``replicas`` (8), ``threads`` (1; None: torch's default), ``blocking``
    (True), ``pipelined`` (True), ``context_sleep`` (True) and ``decoder`` (``torchvision``;
    ``nvimgcodec``: ``expert_decoders``), as the module docstring says."""
    replicas = int(args.get("replicas", 8))
    threads = args.get("threads", 1)
    return ExpertClassifier.options(
        num_replicas=replicas,
        max_ongoing_requests=MAX_ONGOING,
        ray_actor_options={"num_gpus": round(1.0 / replicas, 4), "num_cpus": 1},
    ).bind(
        None if threads is None else int(threads),
        bool(args.get("blocking", True)),
        bool(args.get("pipelined", True)),
        bool(args.get("context_sleep", True)),
        str(args.get("decoder", "torchvision")),
    )
