"""The expert Ray Serve app for the image workload (issue 33): the U-Net of
``benchmarks/image_workload.py`` on JPEG frames, answered as JPEGs at each frame's own size,
written the way ``rayserve_expert.py`` writes the classifier.

One deployment behind Serve's HAProxy ingress. A replica batches requests with
``@serve.batch(max_batch_size=64, batch_wait_timeout_s=0.004)`` and runs each batch on one
GPU thread of its own, so its event loop keeps reading requests meanwhile:

1. the batch's JPEGs are decoded in one nvJPEG call
   (``torchvision.io.decode_jpeg(list, device="cuda")``);
2. each group of same-sized frames is stretched to 256x256 (bilinear, antialiased) and
   normalised (ImageNet's mean and std, as Ferry's image feed) into the static fp16
   channels-last input of the batch's padded size;
3. the U-Net runs in fp16 through ``torch.compile(mode="reduce-overhead")`` with inductor's
   freezing: a CUDA graph per padded batch size (8, 16, 32, 64);
4. the normalisation is undone, each output is resized back to its frame's size (bilinear)
   and rounded to uint8 -- still on the GPU;
5. the frames are encoded as JPEGs (quality 90, 4:4:4, as Ferry's simplejpeg) on the GPU in
   one call (``torchvision.io.encode_jpeg(list)`` of CUDA tensors, nvJPEG; torchvision
   >= 0.19), and the encoded bytes come to the host in one copy through a pinned buffer.

The answer is the JPEG (``image/jpeg``) with ``Server-Timing``: ``queue`` (from the body read
to its batch starting on the GPU thread) and ``batch`` (that batch's time there, decode to
host copy). ``replicas`` replicas share the GPU (``num_gpus = 1 / replicas``).

    import_path: benchmarks.peers.rayserve_image:build_app
    args: {replicas: 8, model: /tmp/ferry-unet/unet256.pt2}

The weights are those of the ``torch.export`` archive Ferry serves (``model``), loaded into
``tests/models/tasks.py``'s U-Net (a plain module: what ``torch.compile`` and CUDA graphs
take best). torchvision's nvJPEG encoder and decoder run on private streams that do not wait
for the caller's stream (pytorch/vision#8587, #9060, #9606): the frames are synchronised
before they are encoded, and a batch is decoded only after the previous one's host copy,
with nothing left queued. Start with ``RAY_SERVE_ENABLE_HA_PROXY=1`` (bench_e2e sets it,
and Serve's throughput mode). Nothing here imports torch until a replica starts, so the
module loads on a CPU-only machine.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from benchmarks.image_workload import QUALITY, UNET_PATH, UNET_SIZE
from benchmarks.peers.rayserve_expert import MEAN, STD, bucket_of, decode_on_gpu
from tests.models.tasks import unet  # torch only when called

BUCKETS = (8, 16, 32, 64)
"""Padded batch sizes, one CUDA graph each; the largest is the batch limit (Ferry's too)."""
WAIT_S = 0.004
BAD = {"error": "not a JPEG the GPU decoder reads"}


def size_groups(sizes: Sequence[tuple[int, int] | None]) -> dict[tuple[int, int], list[int]]:
    """The indices of each distinct size, in first-seen order; None (a frame that did not
    decode) is in no group."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(sizes):
        if s is not None:
            groups.setdefault(tuple(s), []).append(i)
    return groups


def split_bytes(buf: Any, lengths: Sequence[int]) -> list[bytes]:
    """``buf`` (bytes, or a uint8 array) cut into consecutive pieces of ``lengths``."""
    out, at = [], 0
    for n in lengths:
        out.append(bytes(buf[at : at + n]))
        at += n
    if at != len(buf):
        raise ValueError(f"{len(buf)} bytes for pieces of {sum(lengths)}")
    return out


def timing_header(queue_s: float, batch_s: float) -> str:
    """The answer's ``Server-Timing``: its wait for the batch and the batch's time, in ms."""
    return f"queue;dur={queue_s * 1e3:.3f}, batch;dur={batch_s * 1e3:.3f}"


def place(answers: Sequence[bytes], ok: Sequence[bool]) -> list[bytes | None]:
    """``answers`` (one a decoded frame) put back among the frames that did not decode."""
    it = iter(answers)
    out = [next(it) if good else None for good in ok]
    if next(it, None) is not None:
        raise ValueError("more answers than decoded frames")
    return out


def load_unet(path: str) -> Any:
    """The U-Net with the weights of the ``torch.export`` archive at ``path``: a plain
    module (eval, fp32, CPU), its width read from the weights."""
    import torch  # optional: torch

    state = torch.export.load(path).state_dict
    model = unet(width=int(state["d1.0.weight"].shape[0]))
    model.load_state_dict(state, strict=True)
    return model.eval()


def to_input(images: Sequence[Any], x: Any, mean: Any, std: Any) -> None:
    """Each decoded CHW uint8 frame (None: skipped) stretched to ``x``'s size (bilinear,
    antialiased, as Pillow), normalised (``mean``/``std`` on the 0-1 scale, [1, 3, 1, 1])
    and written into its row of ``x``; one resize a group of same-sized frames."""
    import torch  # optional: torch

    size = tuple(x.shape[-2:])
    shapes = [None if im is None else tuple(im.shape[1:]) for im in images]
    for idx in size_groups(shapes).values():
        batch = torch.stack([images[i] for i in idx]).float()
        batch = torch.nn.functional.interpolate(
            batch, size=size, mode="bilinear", antialias=True, align_corners=False
        )
        batch = (batch / 255 - mean) / std
        x[torch.as_tensor(idx, device=x.device)] = batch.to(x.dtype)


def to_frames(y: Any, sizes: Sequence[tuple[int, int] | None], mean: Any, std: Any) -> list[Any]:
    """The model's outputs ``y`` [n, 3, S, S] as uint8 CHW frames: the normalisation undone,
    clipped to 0-255, each resized (bilinear, antialiased) to its (height, width) in
    ``sizes`` (None: no frame)."""
    import torch  # optional: torch

    pixels = ((y.float() * std + mean) * 255).clamp_(0, 255)
    out: list[Any] = [None] * len(sizes)
    for (h, w), idx in size_groups(sizes).items():
        batch = pixels[torch.as_tensor(idx, device=pixels.device)]
        if (h, w) != tuple(batch.shape[-2:]):
            batch = torch.nn.functional.interpolate(
                batch, size=(h, w), mode="bilinear", antialias=True, align_corners=False
            )
        # contiguous CHW: nvJPEG reads planes (a channels-last model's output is not)
        frames = batch.round_().clamp_(0, 255).to(torch.uint8).contiguous()
        for k, i in enumerate(idx):
            out[i] = frames[k]
    return out


def once_per_machine(tag: str, fn: Callable[[], None]) -> None:
    """Run ``fn`` alone first: replicas start together, the first compiles and fills
    inductor's on-disk cache, the others then run ``fn`` loading from it."""
    marker = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ferry-image-peer-{tag}.warm")
    with open(marker + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        first = not os.path.exists(marker)
        if first:
            fn()
            open(marker, "w").close()
    if not first:
        fn()


def cpu_decode(bodies: Sequence[bytes]) -> list[Any]:
    """The CPU form's decode: CHW uint8 tensors (simplejpeg), None for a body it refuses."""
    import simplejpeg
    import torch  # optional: torch

    out: list[Any] = []
    for b in bodies:
        try:
            out.append(torch.from_numpy(simplejpeg.decode_jpeg(b)).permute(2, 0, 1))
        except ValueError:
            out.append(None)
    return out


def cpu_encode(frames: Sequence[Any], quality: int = QUALITY) -> list[bytes]:
    """The CPU form's encode: each CHW uint8 frame as a JPEG (simplejpeg, 4:4:4)."""
    import simplejpeg

    return [
        simplejpeg.encode_jpeg(f.permute(1, 2, 0).contiguous().numpy(), quality) for f in frames
    ]


class ImageCore:
    """The replica's work without Serve: JPEG bodies in, JPEG answers out (None for a body
    the decoder refuses). Needs CUDA and torchvision, but for its CPU form (``device``)."""

    def __init__(
        self,
        model: str = UNET_PATH,
        buckets: tuple[int, ...] = BUCKETS,
        compile: bool = True,
        quality: int = QUALITY,
        threads: int | None = None,
        device: str = "cuda",
    ) -> None:
        """``device``: ``cuda`` (the peer as measured) or ``cpu`` -- the same steps on the
        CPU in fp32, JPEGs decoded and encoded by simplejpeg, nothing compiled: what the
        peer's tests run through a real Serve app on a machine without a GPU."""
        import torch  # optional: torch

        self.torch, self.buckets, self.quality = torch, tuple(buckets), quality
        self.cpu = device == "cpu"
        if threads is not None:
            torch.set_num_threads(threads)
        if self.cpu:
            self.net = load_unet(model)
            self.mean = torch.tensor(MEAN).view(1, 3, 1, 1)
            self.std = torch.tensor(STD).view(1, 3, 1, 1)
            self.inputs = {b: torch.zeros(b, 3, UNET_SIZE, UNET_SIZE) for b in self.buckets}
            self._decode, self._encode = cpu_decode, partial(cpu_encode, quality=quality)
            return
        torch.backends.cudnn.benchmark = True
        net = load_unet(model).half().cuda().to(memory_format=torch.channels_last)
        if compile:
            import torch._inductor.config as inductor  # optional: torch

            inductor.freezing = True  # weights as constants
            net = torch.compile(net, mode="reduce-overhead", dynamic=False)
        self.net = net
        self.mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1)
        # one static input per bucket: the CUDA graph of that size reads from it
        self.inputs = {
            b: torch.zeros((b, 3, UNET_SIZE, UNET_SIZE), device="cuda", dtype=torch.float16).to(
                memory_format=torch.channels_last
            )
            for b in self.buckets
        }
        self.host = torch.empty(16 << 20, dtype=torch.uint8, pin_memory=True)
        tag = f"{torch.__version__}-{os.path.basename(model)}-{'-'.join(map(str, self.buckets))}"
        once_per_machine(tag, self._warm)

    def _warm(self) -> None:
        """Every bucket three times (reduce-overhead records its graph on a later call),
        through decode and encode too, with a 1280x720 frame of noise."""
        torch = self.torch
        from torchvision.io import encode_jpeg  # optional: torchvision

        noise = torch.randint(0, 256, (3, 720, 1280), dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        body = encode_jpeg(noise, quality=self.quality).cpu().numpy().tobytes()
        for b in self.buckets:
            for _ in range(3):
                self.process([body] * b)
        torch.cuda.synchronize()

    def _run(self, bucket: int) -> Any:
        torch = self.torch
        with torch.no_grad():
            if not self.cpu:
                torch.compiler.cudagraph_mark_step_begin()  # the last batch's outputs are read
            return self.net(self.inputs[bucket])

    def _decode(self, bodies: list[bytes]) -> list[Any]:
        return decode_on_gpu(self.torch, bodies)  # a body nvJPEG refuses is None

    def _encode(self, frames: list[Any]) -> list[bytes]:
        """The frames as JPEGs, encoded on the GPU in one call, to the host in one copy."""
        torch = self.torch
        from torchvision.io import encode_jpeg  # optional: torchvision

        # nvJPEG encodes on a stream of its own that does not wait for this one
        torch.cuda.current_stream().synchronize()
        encoded = encode_jpeg(frames, quality=self.quality)
        lengths = [int(e.numel()) for e in encoded]
        total = sum(lengths)
        if total > self.host.numel():
            self.host = torch.empty(2 * total, dtype=torch.uint8, pin_memory=True)
        self.host[:total].copy_(torch.cat(encoded), non_blocking=True)
        torch.cuda.current_stream().synchronize()
        return split_bytes(self.host[:total].numpy(), lengths)

    def process(self, bodies: list[bytes]) -> list[bytes | None]:
        n = len(bodies)
        bucket = bucket_of(n, self.buckets)
        images = self._decode(bodies)
        ok = [im is not None for im in images]
        if not any(ok):
            return [None] * n
        to_input(images, self.inputs[bucket], self.mean, self.std)
        y = self._run(bucket)[:n]
        sizes = [tuple(im.shape[1:]) if im is not None else None for im in images]
        frames = [f for f in to_frames(y, sizes, self.mean, self.std) if f is not None]
        return place(self._encode(frames), ok)


class ImageBatcher:
    """A replica's batching of frames, shared by the HTTP peer and the streams peer
    (``rayserve_streams.py``): ``answer((body, arrived))`` joins a ``@serve.batch`` that runs
    on the replica's one GPU thread (CUDA graph trees are per thread), and gives back the
    frame's JPEG (None: not a JPEG) and its (queue, batch) seconds."""

    def __init__(self, model: str = UNET_PATH, threads: int | None = None, device: str = "cuda"):
        self.gpu = ThreadPoolExecutor(1, thread_name_prefix="image-gpu")  # one: CUDA graphs
        self.core = self.gpu.submit(
            lambda: ImageCore(model, threads=threads, device=device)
        ).result()

    def _process(
        self, items: list[tuple[bytes, float]]
    ) -> list[tuple[bytes | None, tuple[float, float]]]:
        t0 = time.perf_counter()
        out = self.core.process([body for body, _ in items])
        batch_s = time.perf_counter() - t0
        return [(o, (t0 - t, batch_s)) for o, (_, t) in zip(out, items, strict=True)]

    @serve.batch(max_batch_size=BUCKETS[-1], batch_wait_timeout_s=WAIT_S)
    async def answer(
        self, items: list[tuple[bytes, float]]
    ) -> list[tuple[bytes | None, tuple[float, float]]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.gpu, self._process, items)


@serve.deployment
class ExpertImage(ImageBatcher):
    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        data, (queue_s, batch_s) = await self.answer((body, time.perf_counter()))
        if data is None:
            return JSONResponse(BAD, status_code=400)
        timing = timing_header(queue_s, batch_s)
        return Response(data, media_type="image/jpeg", headers={"server-timing": timing})


def build_app(args: dict[str, Any]) -> serve.Application:
    """``args``: ``replicas`` (8), ``model`` (the U-Net's ``.pt2``, ``UNET_PATH``),
    ``threads`` (torch's intra-op CPU threads; None keeps torch's default) and ``device``
    (``cuda``; ``cpu`` for tests on a machine without a GPU: then no GPU is asked for)."""
    return ExpertImage.options(**deployment_options(args)).bind(*batcher_args(args))


def deployment_options(args: dict[str, Any], max_ongoing: int = 2 * BUCKETS[-1]) -> dict[str, Any]:
    """Serve options of ``replicas`` replicas sharing the GPU (none on ``device: cpu``);
    ``max_ongoing``: by default room for a full batch queued behind one running."""
    replicas = int(args.get("replicas", 8))
    gpus = 0 if args.get("device", "cuda") == "cpu" else round(1.0 / replicas, 4)
    return {
        "num_replicas": replicas,
        "max_ongoing_requests": max_ongoing,
        "ray_actor_options": {"num_gpus": gpus, "num_cpus": 0 if gpus == 0 else 1},
    }


def batcher_args(args: dict[str, Any]) -> tuple[str, int | None, str]:
    threads = args.get("threads")
    return (
        str(args.get("model", UNET_PATH)),
        None if threads is None else int(threads),
        str(args.get("device", "cuda")),
    )
