"""Helpers for the integration tests: the test app's config, deployment, test images."""

from __future__ import annotations

import os
import struct
import subprocess

import numpy as np

PORT = int(os.environ.get("FERRY_TEST_PORT", "8123"))
BASE = f"http://127.0.0.1:{PORT}"
# Serve's gRPC proxy (Ferry's inference.GRPCInferenceService): 1000 above the HTTP port
GRPC_PORT = int(os.environ.get("FERRY_TEST_GRPC_PORT", str(PORT + 1000)))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_ok(
    argv: list[str], env: dict, timeout: float, stderr_tail: int = 2000
) -> subprocess.CompletedProcess:
    """Run a command from the project root; fail with the ends of its output unless it
    exits 0."""
    r = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-stderr_tail:]
    return r


# a stopping replica looks every 0.1 s whether its requests are done, not every 2 s (Serve's
# default, slept before the first look): each undeploy and redeploy is 2 s shorter
QUICK_STOP = {"graceful_shutdown_wait_loop_s": 0.1}


def cpu_config(**overrides):
    """A small all-CPU pipeline: digits + random-weight ResNet-50, buckets up to 8."""
    from pipeline.config import PipelineConfig

    base = {
        "models": [{"name": "digits", "arch": "digits"}, {"name": "resnet50", "arch": "resnet50"}],
        "executor": {
            "backend": "numpy",
            "buckets": [1, 2, 4, 8],
            "max_in_flight": 2,
            "pool_limit_fraction": 0.2,
        },
        # the queue budget off: these configs check what the service answers, and on two busy
        # cores the default 1 s budget rightly sheds part of a burst (503 QueueFull, CI on
        # d6a340c); the tests of the budget set one (test_overload, test_queue_budget)
        "batching": {"max_wait_ms": 10, "queue_policy": {"timeout_ms": None}},
        "ingress": {"coalesce_window_ms": 2.0, "max_coalesce": 32},
        "preprocess": {"threads": 2},
        "ingress_deployment": {"num_cpus": 0.25, "max_ongoing_requests": 512, **QUICK_STOP},
        "preprocess_deployment": {"num_cpus": 0.25, "max_ongoing_requests": 128, **QUICK_STOP},
        "inference_deployment": {"num_cpus": 1.0, "max_ongoing_requests": 128, **QUICK_STOP},
        "postprocess_deployment": {"num_cpus": 0.25, "max_ongoing_requests": 128, **QUICK_STOP},
    }
    for k, v in overrides.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return PipelineConfig.model_validate(base)


def deploy(config, name: str = "ferry") -> str:
    from ray import serve

    from deployments.app import build

    serve.run(build(config), name=name, route_prefix="/")
    return BASE


def undeploy(name: str = "ferry") -> None:
    from ray import serve

    serve.delete(name)


def photos() -> dict[str, np.ndarray]:
    """scikit-image's bundled RGB photos (no network)."""
    import skimage.data as d

    return {n: getattr(d, n)() for n in ("chelsea", "astronaut", "coffee", "rocket")}


def jpeg_of_size(img: np.ndarray, size: int, quality: int = 80) -> bytes:
    """A valid JPEG of exactly ``size`` bytes: a comment segment pads it after SOI."""
    from pipeline.imaging import encode_jpeg

    raw = encode_jpeg(img, quality)
    pad = size - len(raw)
    if pad < 4:
        raise ValueError(f"image already {len(raw)} bytes, cannot make {size}")
    out = bytearray(raw[:2])
    while pad > 0:
        n = min(pad, 65535 + 2)
        if pad - n in (1, 2, 3):  # leave room for one more whole segment
            n -= 4
        out += b"\xff\xfe" + struct.pack(">H", n - 2) + b"\0" * (n - 4)
        pad -= n
    out += raw[2:]
    assert len(out) == size
    return bytes(out)


def png_header_claiming(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height (and nothing decodable after)."""
    import zlib

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = (
        struct.pack(">I", len(ihdr))
        + b"IHDR"
        + ihdr
        + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    )
    return b"\x89PNG\r\n\x1a\n" + chunk


def classify_many(
    base: str, blobs: list[tuple[bytes, str]], model: str, query: str = "", concurrency: int = 32
) -> list:
    """POST every (body, content type) to ``/v1/models/{model}/classify{query}``,
    ``concurrency`` at a time; the responses in order."""
    import asyncio

    import httpx

    async def main():
        sem = asyncio.Semaphore(concurrency)
        async with httpx.AsyncClient(base_url=base, timeout=60) as c:

            async def one(body, ct):
                async with sem:
                    return await c.post(
                        f"/v1/models/{model}/classify{query}",
                        content=body,
                        headers={"content-type": ct},
                    )

            return await asyncio.gather(*(one(b, ct) for b, ct in blobs))

    return asyncio.run(main())
