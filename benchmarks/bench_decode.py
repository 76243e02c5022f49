"""Preprocessing throughput and its CPU cost: JPEG decode + resize to ResNet-50's input.

    python benchmarks/bench_decode.py [--out benchmarks/results/decode.json] [--seconds 3]

The same JPEG (scikit-image chelsea, 451x300, quality 90), made into uint8 224x224x3
batches by:

* ``cpu_simplejpeg_<t>t``: Ferry's CPU stage (``PreprocessStage``): simplejpeg at the
  smallest DCT scale that suffices, Pillow's bilinear resize and centre crop, on ``t``
  worker threads. The baseline, and what a Ray Serve replica can do without a GPU.
* ``gpu_<backend>``: Ferry's GPU stage fused into the inference replica
  (``PreprocessGpuStage(local=True)``): nvImageCodec decodes the call's JPEGs on the GPU
  (nvJPEG's hardware engines, its CUDA decoder, or hybrid), the antialiased resize
  kernel fits them into one device batch; two calls in flight.

``cpu_ms_per_img`` is the process's CPU time (all its threads: user + system) per image.
On a node whose cores are the end-to-end limit that is the number that matters: at the
same throughput it is how many cores preprocessing takes from the HTTP and Serve work.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import machine, table, today, write_json  # noqa: E402


def _config(gpu: bool = False, **pre):
    from pipeline.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "models": [{"name": "resnet50", "arch": "resnet50"}],
            "executor": {"backend": "cupy" if gpu else "numpy"},
            "preprocess": pre,
            "placement": "split",  # decoding in the process that owns the executor
            "inference_deployment": {"num_gpus": 1 if gpu else 0},
        }
    )


async def _rate(run, items, seconds: float, in_flight: int) -> tuple[float, float, int]:
    """(img/s, CPU ms per image, images) of calling ``run(items)`` with ``in_flight``
    calls outstanding for about ``seconds``."""
    for _ in range(2):
        await run(items)
    done = 0
    t0, c0 = time.perf_counter(), time.process_time()

    async def worker():
        nonlocal done
        while time.perf_counter() - t0 < seconds:
            rows = await run(items)
            assert not rows.errors, rows.errors
            done += len(rows.owner)

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return done / wall, cpu * 1e3 / max(1, done), done


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/decode.json")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=64, help="images per call")
    ap.add_argument("--threads", default="1,4,8", help="CPU stage thread counts")
    ap.add_argument("--backends", default="auto,hardware,cuda,hybrid")
    args = ap.parse_args()
    import skimage.data

    from pipeline.imaging import encode_jpeg

    blob = encode_jpeg(skimage.data.chelsea(), quality=90)
    from pipeline.models.repository import model_card
    from pipeline.stages.messages import Encoded

    target = model_card(_config().models[0]).target()
    one = Encoded.checked(blob, "image/jpeg", target, 1 << 31, 1 << 36)  # checked once
    items = [one] * args.batch
    rows = []

    from pipeline.stages.decode import PreprocessStage

    for t in [int(x) for x in args.threads.split(",") if x]:
        core = PreprocessStage(_config(threads=t))
        rate, cpu_ms, n = asyncio.run(
            _rate(lambda it, c=core: c.run("resnet50", it), items, args.seconds, 2)
        )
        core.pool.shutdown()
        rows.append({"path": f"cpu_simplejpeg_{t}t", "img_s": rate, "cpu_ms_per_img": cpu_ms})
        print(f"{rows[-1]['path']}: {rate:,.0f} img/s, {cpu_ms:.3f} CPU ms/img ({n} images)")

    from pipeline import gpu_decode
    from pipeline.stages.preprocess_gpu import PreprocessGpuStage

    if not gpu_decode.available():
        print("nvImageCodec is not installed: no GPU rows")
    for b in [x for x in args.backends.split(",") if x] if gpu_decode.available() else []:
        cfg = _config(gpu=True, decoder="nvimgcodec", gpu_decode_backend=b, threads=4)
        core = PreprocessGpuStage(cfg, 0, local=True)
        rate, cpu_ms, n = asyncio.run(
            _rate(lambda it, c=core: c.run("resnet50", it), items, args.seconds, 2)
        )
        core.close()
        rows.append({"path": f"gpu_{b}", "img_s": rate, "cpu_ms_per_img": cpu_ms})
        print(f"{rows[-1]['path']}: {rate:,.0f} img/s, {cpu_ms:.3f} CPU ms/img ({n} images)")

    base = next((r for r in rows if r["path"].startswith("cpu_") and "_1t" in r["path"]), None)
    for r in rows:
        if base:
            r["img_s_vs_cpu_1t"] = r["img_s"] / base["img_s"]
            r["cpu_ms_vs_cpu_1t"] = r["cpu_ms_per_img"] / base["cpu_ms_per_img"]
    print(table(rows, ["path", "img_s", "cpu_ms_per_img", "img_s_vs_cpu_1t", "cpu_ms_vs_cpu_1t"]))
    write_json(
        args.out,
        {
            "machine": machine(),
            "date": today(),
            "image": f"scikit-image chelsea 451x300, JPEG quality 90, {len(blob)} bytes",
            "method": (
                f"{args.batch} images per call, 2 calls in flight, {args.seconds} s per row, "
                "one process; CPU ms = process CPU time (all threads) per image; baseline "
                "cpu_simplejpeg_1t measured in the same run"
            ),
            "rows": rows,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
