"""The expert Ray Serve app: what a strong Ray Serve user writes in an afternoon.

One deployment behind Serve's HAProxy ingress. A replica batches requests with
``@serve.batch(max_batch_size=128, batch_wait_timeout_s=0.004)``, decodes the whole batch's
JPEGs on the GPU in one call (``torchvision.io.decode_jpeg(list, device="cuda")``, nvJPEG),
resizes each group of same-sized images to 256 on the shorter side (bilinear, antialiased)
and crops the centre 224x224 there, normalises, and runs torchvision's ResNet-50 in fp16,
channels_last, through ``torch.compile(mode="reduce-overhead")`` with inductor's freezing:
a CUDA graph per padded batch size (8, 32, 128; a batch is padded up to the next). The GPU
work runs on one thread of the replica's own, so its event loop keeps reading requests while
a batch is on the GPU. ``replicas`` replicas share the GPU (``num_gpus = 1 / replicas``).

    import_path: benchmarks.peers.rayserve_expert:build_app   args: {replicas: 8}

The weights are random (``weights=None``), as in the usual app: the same work either way.
Start with ``RAY_SERVE_ENABLE_HA_PROXY=1`` (bench_e2e sets it, and Serve's throughput mode).
Nothing here imports torch until a replica starts, so the module loads on a CPU-only machine.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ray import serve
from starlette.requests import Request

BUCKETS = (8, 32, 128)
"""Padded batch sizes, one CUDA graph each; the largest is the batch limit."""
WAIT_S = 0.004
SHORT_SIDE, CROP = 256, 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


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


def decode_on_gpu(torch: Any, bodies: list[bytes]) -> list[Any]:
    """CHW uint8 images on the GPU, one batched nvJPEG call; a body it refuses is None."""
    from torchvision.io import ImageReadMode, decode_jpeg  # optional: torchvision

    datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in bodies]
    try:
        return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device="cuda"))
    except (RuntimeError, ValueError):  # one bad image fails the batch: one by one
        out = []
        for d in datas:
            try:
                out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device="cuda"))
            except (RuntimeError, ValueError):
                out.append(None)
        return out


class ExpertCore:
    """The replica's work without Serve: JPEG bodies in, top-5 classes out."""

    def __init__(
        self,
        buckets: tuple[int, ...] = BUCKETS,
        compile: bool = True,
        threads: int | None = None,
        blocking: bool = False,
    ) -> None:
        """``threads``: torch's intra-op CPU threads (``torch.set_num_threads``; None keeps
        torch's default, one per core); ``blocking``: wait for a batch on an event that
        sleeps (``torch.cuda.Event(blocking=True)``) rather than in the copy's spin-wait."""
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
        self.labels = torchvision.models.ResNet50_Weights.IMAGENET1K_V1.meta["categories"]
        self.mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
        self.std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255
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
            f"ferry-expert-{self.torch.__version__}-{'-'.join(map(str, self.buckets))}.warm",
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
        for b in self.buckets:
            for _ in range(3):  # reduce-overhead records its graph on a later call
                self._run(b)
        self.torch.cuda.synchronize()

    def _run(self, bucket: int) -> Any:
        torch = self.torch
        with torch.no_grad():
            torch.compiler.cudagraph_mark_step_begin()  # the last batch's outputs are read
            return self.model(self.inputs[bucket])

    def _decode(self, bodies: list[bytes]) -> list[Any]:
        return decode_on_gpu(self.torch, bodies)

    def _fill(self, images: list[Any], x: Any) -> None:
        """Resize (antialiased), crop and normalise into ``x[:len(images)]``, one call per
        group of same-sized images."""
        torch = self.torch
        groups: dict[tuple[int, int], list[int]] = {}
        for i, img in enumerate(images):
            if img is not None:
                groups.setdefault(tuple(img.shape[1:]), []).append(i)
        for (h, w), idx in groups.items():
            batch = torch.stack([images[i] for i in idx]).float()
            rh, rw = resized_size(h, w)
            batch = torch.nn.functional.interpolate(
                batch, size=(rh, rw), mode="bilinear", antialias=True, align_corners=False
            )
            top, left = (rh - CROP) // 2, (rw - CROP) // 2
            batch = batch[:, :, top : top + CROP, left : left + CROP]
            batch = ((batch - self.mean) / self.std).half()
            x[torch.as_tensor(idx, device="cuda")] = batch

    def classify(self, bodies: list[bytes]) -> list[dict[str, Any]]:
        n = len(bodies)
        bucket = bucket_of(n, self.buckets)
        images = self._decode(bodies)
        self._fill(images, self.inputs[bucket])
        logits = self._run(bucket)[:n]
        vals, idx = logits.float().softmax(dim=1).topk(5, dim=1)
        if self.blocking:  # the thread sleeps until the batch is done, instead of spinning
            done = self.torch.cuda.Event(blocking=True)
            done.record()
            done.synchronize()
        vals, idx = vals.cpu().tolist(), idx.cpu().tolist()  # waits for the batch
        return [
            {"error": "not a JPEG the GPU decoder reads"}
            if img is None
            else {
                "top_k": [
                    {"label": self.labels[i], "class": i, "score": v}
                    for v, i in zip(vs, ix, strict=True)
                ]
            }
            for img, vs, ix in zip(images, vals, idx, strict=True)
        ]


@serve.deployment
class ExpertClassifier:
    def __init__(self, threads: int | None = None, blocking: bool = False) -> None:
        self.gpu = ThreadPoolExecutor(1, thread_name_prefix="expert-gpu")  # one thread: CUDA graphs
        self.core = self.gpu.submit(lambda: ExpertCore(threads=threads, blocking=blocking)).result()

    @serve.batch(max_batch_size=BUCKETS[-1], batch_wait_timeout_s=WAIT_S)
    async def classify(self, bodies: list[bytes]) -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.gpu, self.core.classify, bodies)

    async def __call__(self, request: Request) -> Any:
        answer = await self.classify(await request.body())
        if "error" in answer:
            from starlette.responses import JSONResponse

            return JSONResponse(answer, status_code=400)
        return answer


def build_app(args: dict[str, Any]) -> serve.Application:
    """``args``: ``replicas`` (8), and ``threads`` / ``blocking`` as ``ExpertCore`` takes them."""
    replicas = int(args.get("replicas", 8))
    threads = args.get("threads")
    return ExpertClassifier.options(
        num_replicas=replicas,
        max_ongoing_requests=2 * BUCKETS[-1],  # room for a full batch queued behind one running
        ray_actor_options={"num_gpus": round(1.0 / replicas, 4), "num_cpus": 1},
    ).bind(None if threads is None else int(threads), bool(args.get("blocking", False)))
