"""JPEG decoding on the GPU (nvImageCodec) and preprocessing fused into the inference
replica: the pixels agree with the CPU path, bad images get the CPU path's errors, and the
Serve app on one GPU classifies as the CPU path does."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.imaging import decode, encode_jpeg, encode_png
from pipeline.models.registry import model_info

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvimgcodec():
    return pytest.importorskip("nvidia.nvimgcodec")


def _photos() -> dict[str, np.ndarray]:
    import skimage.data as d

    return {n: getattr(d, n)() for n in ("chelsea", "astronaut", "coffee", "rocket")}


def exact(blob: bytes, target) -> np.ndarray:
    """The reference the GPU path follows: the JPEG decoded in full (libjpeg-turbo, exact
    IDCT and upsampling, as nvJPEG decodes it) and fitted by Pillow. (The CPU stage decodes
    at a reduced DCT scale where that still covers the target, which filters differently.)"""
    import simplejpeg

    from pipeline.imaging import fit

    gray = target.channels == 1
    img = simplejpeg.decode_jpeg(
        blob, colorspace="GRAY" if gray else "RGB", fastdct=False, fastupsample=False
    )
    return fit(img if img.ndim == 3 else img[..., None], target)


def _config(**over) -> PipelineConfig:
    raw = {
        "models": [{"name": "resnet50", "arch": "resnet50"}, {"name": "digits", "arch": "digits"}],
        "executor": {"backend": "cupy"},
        "placement": "split",
        "preprocess": {"decoder": "nvimgcodec"},
        "inference_deployment": {"num_gpus": 1},
    }
    raw.update(over)
    return PipelineConfig.model_validate(raw)


@pytest.mark.parametrize(
    "backends, hw_load",
    [("auto", 1.0), ("hardware", 1.0), ("hardware", 0.5), ("cuda", 1.0), ("hybrid", 1.0)],
)
def test_nvimgcodec_decodes_photos_as_libjpeg_does(nvimgcodec, backends, hw_load):
    import cupy
    import simplejpeg

    from pipeline.gpu_decode import decoder_for
    from pipeline.preprocess_gpu.fitter import device_view

    dec = decoder_for(0, cpu_threads=2, backends=backends, hw_load=hw_load)
    photos = _photos()
    blobs = [encode_jpeg(img, quality=90) for img in photos.values()]
    stream = cupy.cuda.Stream(non_blocking=True)
    imgs = dec.decode(blobs, 3, stream)
    gray = dec.decode([encode_jpeg(photos["coffee"][..., :1])], 1, stream)[0]
    stream.synchronize()
    for (name, _), blob, img in zip(photos.items(), blobs, imgs, strict=True):
        got = device_view(img).get()
        want = simplejpeg.decode_jpeg(blob, colorspace="RGB", fastdct=False, fastupsample=False)
        assert got.shape == want.shape, (name, got.shape, want.shape)
        diff = np.abs(got.astype(np.int16) - want)
        print(f"{backends} {name}: mean |diff| {diff.mean():.3f}, max {diff.max()}")
        # IDCT and chroma upsampling differ between decoders by a level or two
        assert diff.mean() < 1.0 and np.percentile(diff, 99) <= 6, (name, diff.mean())
    print({k: v for k, v in imgs[0].__cuda_array_interface__.items() if k != "data"})
    g = device_view(gray).get()
    assert g.shape[:2] == photos["coffee"].shape[:2] and g.size == g.shape[0] * g.shape[1]


@pytest.mark.parametrize("rounds", [1, 2])
def test_fused_gpu_preprocess_mixed_call_matches_cpu_and_keeps_errors_apart(nvimgcodec, rounds):
    """(``rounds``: ``preprocess.decode_rounds``; with 2 the two calls may decode at once,
    each round on its own lane's decoder and stream.)"""
    from pipeline.stages.preprocess_gpu import PreprocessGpuStage

    pre = {"decoder": "nvimgcodec", "decode_rounds": rounds}
    core = PreprocessGpuStage(_config(preprocess=pre), 0, local=True)
    assert core.core.decoder is not None and core.core.senders is None  # (no NCCL endpoint)
    lanes = core.core.lanes.all
    assert len(lanes) == rounds and len({id(lane.decoder) for lane in lanes}) == rounds
    target = model_info("resnet50").target()
    photos = list(_photos().values())
    from pipeline.errors import FerryError
    from pipeline.stages.messages import Encoded

    def checked(data, ct):  # as the ingress checks each image before it sends it on
        try:
            return Encoded.checked(data, ct, target, 1 << 30, 1 << 32)
        except FerryError as exc:
            return exc

    raw = [(encode_jpeg(img, quality=90), "image/jpeg") for img in photos]
    jpegs = [checked(*j) for j in raw]
    given = [
        raw[0],
        (b"\xff\xd8\xff\xe0 not really a jpeg", "image/jpeg"),  # header check: 400
        (encode_png(photos[1]), "image/png"),  # PNG: CPU decode, uploaded
        raw[1],
        (raw[2][0][: len(raw[2][0]) // 3], "image/jpeg"),  # truncated body
        raw[2],
        raw[3],
        (encode_jpeg(photos[0], quality=90), "image/png"),  # lies about its type: 415
    ]
    refused = {i: c for i, g in enumerate(given) if isinstance(c := checked(*g), FerryError)}
    assert sorted(refused) == [1, 7]  # the ingress's header checks: 400 and 415
    assert (refused[1].http_status, refused[7].http_status) == (400, 415)
    items = [checked(*g) for i, g in enumerate(given) if i not in refused]
    given = [g for i, g in enumerate(given) if i not in refused]
    import cupy

    async def both():  # two calls at once (they may share a round)
        return await asyncio.gather(core.run("resnet50", items), core.run("resnet50", jpegs))

    rows, second = asyncio.run(both())
    assert second.owner == [0, 1, 2, 3] and not second.errors
    assert rows.envelope is None and rows.n_requests == len(items)
    # left: [jpeg 0, the PNG, jpeg 1, the truncated JPEG, jpeg 2, jpeg 3]
    good = [i for i in range(len(items)) if i not in rows.errors]
    assert sorted(rows.owner) == good  # JPEGs of the round first, then the CPU-decoded
    got = cupy.stack(rows.data).get()
    assert np.array_equal(cupy.stack(second.data).get()[0], got[0])  # the same JPEG
    assert got.shape == (len(good), 224, 224, 3) and got.dtype == np.uint8
    for k, i in enumerate(rows.owner):
        if i == 3:  # truncated: whatever either decoder made of it, a full image came out
            continue
        if i == 1:  # the PNG: decoded on the CPU, fitted on the GPU
            want = decode(given[i][0], given[i][1], target, 1 << 30)
        else:
            want = exact(given[i][0], target)
        diff = np.abs(got[k].astype(np.int16) - want)
        print(f"item {i}: mean |diff| {diff.mean():.3f}, p99.9 {np.percentile(diff, 99.9)}")
        # the same filter as Pillow's; Pillow rounds to uint8 between its two passes
        assert diff.mean() < 0.5 and np.percentile(diff, 99.9) <= 2, (i, diff.mean())
    core.close()


def test_serve_app_on_one_gpu_decodes_in_the_inference_replica():
    """ingress -> inference (nvImageCodec decode, GPU resize, model, top-k) over HTTP, on
    JPEG digits, against the CPU decode + CPU executor path."""
    pytest.importorskip("nvidia.nvimgcodec")
    import ray
    from ray import serve

    from deployments.app import build
    from pipeline.config import ExecutorConfig
    from pipeline.executor import GpuExecutor
    from pipeline.models import digits
    from tests.integration.helpers import classify_many

    _, _, xte, yte = digits.load_split()
    n = 300
    big = np.repeat(np.repeat(xte[:n], 2, axis=1), 2, axis=2)  # 56x56: both paths resize
    jpgs = [encode_jpeg(x, quality=95) for x in big]
    target = model_info("digits").target()
    cpu = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 8, 64)))
    cpu.load_model("digits", "digits")
    cpu_pred, dct_pred = [], []  # the exact reference; the CPU stage (DCT-scaled decode)
    for i in range(0, n, 64):
        rows = [exact(p, target) for p in jpgs[i : i + 64]]
        cpu_pred += list(np.argmax(cpu.infer("digits", np.stack(rows)), axis=1))
        rows = [decode(p, "image/jpeg", target, 1 << 24) for p in jpgs[i : i + 64]]
        dct_pred += list(np.argmax(cpu.infer("digits", np.stack(rows)), axis=1))
    cpu.close()

    config = _config(
        models=[{"name": "digits", "arch": "digits"}],
        executor={"backend": "cupy", "buckets": [1, 8, 32, 64], "pool_limit_fraction": 0.1},
        batching={"max_wait_ms": 5},
        ingress_deployment={"num_cpus": 1},
        inference_deployment={"num_cpus": 1, "num_gpus": 1},
    )
    ray.init(num_gpus=1, num_cpus=8, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": 8132})
        serve.run(build(config), name="gpudec", route_prefix="/")
        deployments = set(serve.status().applications["gpudec"].deployments)
        rs = classify_many(
            "http://127.0.0.1:8132",
            [(p, "image/jpeg") for p in jpgs] + [(b"\xff\xd8\xff junk", "image/jpeg")],
            "digits",
            "?top_k=1",
        )
        serve.delete("gpudec")
        serve.shutdown()
    finally:
        ray.shutdown()
    assert deployments == {"Ingress", "Inference"}
    assert rs[-1].status_code == 400, rs[-1].text
    rs = rs[:-1]
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    gpu_pred = np.array([int(r.json()["top_k"][0]["label"]) for r in rs])
    agree = float(np.mean(gpu_pred == np.array(cpu_pred)))
    acc = float(np.mean(gpu_pred == yte[:n]))
    cpu_acc = float(np.mean(np.array(cpu_pred) == yte[:n]))
    dct_acc = float(np.mean(np.array(dct_pred) == yte[:n]))
    print(
        f"GPU decode in the inference replica: agreement with full decode + Pillow "
        f"{agree:.3f}, accuracy {acc:.3f} (reference {cpu_acc:.3f}, CPU stage with its "
        f"DCT-scaled decode {dct_acc:.3f}) on 2x-upscaled JPEG digits"
    )
    assert agree >= 0.98, agree
    assert acc >= cpu_acc - 0.01 and acc >= 0.9, (acc, cpu_acc)


def test_one_launch_fit_equals_pillow_on_the_same_pixels(nvimgcodec):
    """The batched resize-and-crop kernel (which computes only the output window of each
    image's resize plan) gives what Pillow's fit of the same decoded pixels gives, to a
    level on rounding boundaries (Pillow rounds to uint8 between its two passes), for
    centre-crop (ResNet-50: down, up and no resize) and stretch (digits, grey)."""
    import cupy

    from pipeline.imaging import fit
    from pipeline.preprocess_gpu.fitter import device_view
    from pipeline.stages.preprocess_gpu import PreprocessGpuStage

    core = PreprocessGpuStage(_config(), 0, local=True).core
    photos = list(_photos().values())
    sizes = [(300, 451), (512, 512), (97, 301), (224, 224), (256, 700)]
    cases = {
        "resnet50": [encode_jpeg(photos[i % 4][:h, :w], 90) for i, (h, w) in enumerate(sizes)],
        "digits": [encode_jpeg(photos[1][:h, :w, :1], 90) for h, w in sizes],
    }
    for model, blobs in cases.items():
        t = core.targets[model]
        imgs = core.decoder.decode(blobs, t.channels, core.stream)
        got, keep, refused = core.batch(model, imgs)
        core.stream.synchronize()
        assert keep == list(range(len(blobs))) and not refused
        host = [cupy.asnumpy(device_view(img)) for img in imgs]
        want = np.stack([fit(h if h.ndim == 3 else h[..., None], t) for h in host])
        assert got.shape == want.shape == (len(blobs), t.height, t.width, t.channels)
        diff = np.abs(got.get().astype(np.int16) - want.astype(np.int16))
        print(
            f"{model}: one launch vs Pillow: max |diff| {int(diff.max())}, mean {diff.mean():.4f}"
        )
        assert diff.mean() < 0.5 and np.percentile(diff, 99.9) <= 2, model
        del imgs
    core.close()


_FIRST_CALL = """
import sys
import cupy
import numpy as np
from pipeline import gpu_decode
from pipeline.imaging import encode_jpeg
largest = int(sys.argv[1])
d = gpu_decode.decoder_for(0, 2, "hardware", 1.0, largest=largest)
if not largest:  # the first call as it was before priming: the warm-up's one JPEG
    s = cupy.cuda.Stream(non_blocking=True)
    d.decode([encode_jpeg(np.zeros((227, 229, 3), np.uint8))], 3, s)
    s.synchronize()
"""


def _hw_share_of_first_call(largest: int) -> tuple[list[int], str]:
    """The hardware engines' share of a call, as nvImageCodec's own log (INFO) states it
    when a decoder's first call fixes it, for a decoder made by ``decoder_for(largest=)``."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYNVIMGCODEC_VERBOSITY": "3", "PYTHONPATH": path}
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_CALL, str(largest)],
        env=env, capture_output=True, text=True, timeout=180, cwd=root,
    )  # fmt: skip
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-3000:]
    return [int(n) for n in re.findall(r"hw\S* selecting max batch size to (\d+)", log)], log


def test_a_primed_decoder_gives_the_engines_its_largest_call(nvimgcodec):
    """nvImageCodec fixes each backend's share of a call at the decoder's first call (its
    load hint x that call's images, rounded up to the engines' mini-batch) and keeps it:
    ``decoder_for(largest=)`` makes that first call the largest batch, so the engines may
    take every image of any call; a first call of one JPEG (as before) caps them at one
    mini-batch a call, the rest of each call going to decoders that work on the host."""
    primed, log = _hw_share_of_first_call(96)
    unprimed, _ = _hw_share_of_first_call(0)
    print(
        f"the engines' share of a call: primed with 96 -> {primed}, first call of 1 -> {unprimed}"
    )
    assert primed, "nvImageCodec logged no hardware share:\n" + log[-3000:]
    assert primed[0] >= 96


def test_the_decoders_pool_keeps_a_rounds_images_mapped(nvimgcodec):
    """nvImageCodec puts decoded images in the device's stream-ordered pool; at CUDA's
    release threshold (0) a synchronisation after they are dropped hands their memory back,
    so the next round maps it again. ``decoder_for(keep_bytes=)`` (``keep_decoded``) keeps
    up to that much mapped: a round's images stay reserved once dropped and synchronised."""
    import cupy
    from cupy.cuda import runtime

    from pipeline.gpu_decode import RELEASE_THRESHOLD, decoder_for, keep_decoded

    reserved = 5  # cudaMemPoolAttrReservedMemCurrent
    pool = runtime.deviceGetMemPool(0)
    blobs = [encode_jpeg(img, quality=90) for img in _photos().values()] * 4
    stream = cupy.cuda.Stream(non_blocking=True)

    def a_round(dec) -> tuple[int, int]:
        imgs = dec.decode(blobs, 3, stream)
        used = sum(int(np.prod(i.image.shape)) for i in imgs)
        del imgs  # freed on the stream (cudaFreeAsync), then the round's synchronisation
        stream.synchronize()
        return used, int(runtime.memPoolGetAttribute(pool, reserved))

    before = int(runtime.memPoolGetAttribute(pool, RELEASE_THRESHOLD))
    try:
        runtime.memPoolSetAttribute(pool, RELEASE_THRESHOLD, 0)  # CUDA's default, as before
        dec = decoder_for(0, cpu_threads=2, backends="cuda", hw_load=1.0)
        used, kept_at_0 = a_round(dec)
        assert keep_decoded(0, 64 << 20) == 64 << 20
        assert decoder_for(0, 2, "cuda", 1.0, keep_bytes=32 << 20) is dec  # (the larger stays)
        assert int(runtime.memPoolGetAttribute(pool, RELEASE_THRESHOLD)) == 64 << 20
        _, kept = a_round(dec)
    finally:  # the process's other tests keep what the process had
        runtime.memPoolSetAttribute(pool, RELEASE_THRESHOLD, before)
    print(f"a round of {len(blobs)} images, {used / 2**20:.1f} MiB: reserved after it "
          f"{kept_at_0 / 2**20:.1f} MiB at threshold 0, {kept / 2**20:.1f} MiB at 64 MiB")  # fmt: skip
    assert kept_at_0 < used <= kept


def test_a_round_past_its_bytes_holds_one_run_of_decoded_images_at_a_time(nvimgcodec):
    """``preprocess.gpu_decode_round_bytes`` on the device: a round of 24 JPEGs of
    1920x1080 (6.2 MB decoded each, 149 MB in all) through the local stage. Under a budget
    of 8 MiB they are decoded in runs of one image, about two runs on the device at once,
    so the device pool's peak of memory in use is a fraction of the one-call round's; the
    rows are the same."""
    import cupy
    from cupy.cuda import runtime
    from PIL import Image

    from pipeline.stages.messages import Encoded
    from pipeline.stages.preprocess_gpu import PreprocessGpuStage

    used_high = 8  # cudaMemPoolAttrUsedMemHigh
    pool = runtime.deviceGetMemPool(0)
    target = model_info("resnet50").target()
    photos = [np.asarray(Image.fromarray(p).resize((1920, 1080))) for p in _photos().values()]
    blobs = [encode_jpeg(photos[k % len(photos)], quality=85) for k in range(24)]
    items = [Encoded.checked(b, "image/jpeg", target, 1 << 30, 1 << 32) for b in blobs]
    got = {}
    for budget in (1 << 30, 8 << 20):
        pre = {"decoder": "nvimgcodec", "gpu_decode_round_bytes": budget}
        stage = PreprocessGpuStage(_config(preprocess=pre), 0, local=True)
        cupy.cuda.Device(0).synchronize()
        runtime.memPoolSetAttribute(pool, used_high, 0)  # (resets the peak to what is in use)
        rows = asyncio.run(stage.run("resnet50", items))
        cupy.cuda.Device(0).synchronize()
        high = int(runtime.memPoolGetAttribute(pool, used_high))
        assert rows.owner == list(range(24)) and not rows.errors
        got[budget] = (high, cupy.stack(rows.data).get())
        del rows
        stage.close()
    whole, runs = got[1 << 30][0], got[8 << 20][0]
    print(f"peak in the decoder's pool: {whole / 2**20:.1f} MiB in one call, "
          f"{runs / 2**20:.1f} MiB in runs of 8 MiB")  # fmt: skip
    assert whole >= 24 * 1920 * 1080 * 3 * 0.9  # the one call held every image at once
    assert runs < whole / 4
    assert np.array_equal(got[1 << 30][1], got[8 << 20][1])
