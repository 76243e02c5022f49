"""GPU preprocessing on one device: the fit equals the op's CPU reference and the CPU stage,
allocates nothing outside Ferry's pool while committing, and gives every byte back."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipeline.config import PipelineConfig
from pipeline.imaging import decode, encode_jpeg, encode_png
from pipeline.models.registry import model_info

pytestmark = pytest.mark.gpu


def _stage(local=True, overlap_rounds=False, stream_priority="normal", **transport):
    from pipeline.stages.preprocess_gpu import PreprocessGpuStage

    cfg = PipelineConfig.model_validate(
        {
            "models": [
                {"name": "resnet50", "arch": "resnet50"},
                {"name": "digits", "arch": "digits"},
            ],
            "executor": {"pool_limit_fraction": 0.05},
            "placement": "gpu_preprocess",
            "preprocess": {
                "decoder": "cpu",
                "overlap_rounds": overlap_rounds,
                "stream_priority": stream_priority,
            },
            "preprocess_deployment": {"num_gpus": 1},
            "transport": transport or {"staging_slots": 2, "staging_slot_bytes": 1 << 20},
        }
    )
    return PreprocessGpuStage(cfg, local=local).core


def _fitter(slot_bytes=1 << 20, slots=3):
    from pipeline.async_result import CompletionWatcher
    from pipeline.device import Backend, Stream
    from pipeline.memory import PinnedRing, make_pool
    from pipeline.preprocess_gpu.fitter import GpuFitter

    gpu = Backend("cupy")
    pool = make_pool(gpu, limit_bytes=256 << 20)
    ring = PinnedRing(gpu, slot_bytes, slots)
    compute, copy = Stream("pre", gpu), Stream("h2d", gpu)
    return GpuFitter(gpu, pool, ring, compute, copy, CompletionWatcher("t"), 5.0)


@pytest.mark.parametrize("kind", ["center_crop", "stretch", "letterbox"])
def test_fit_equals_the_ops_cpu_reference_and_allocates_only_from_the_pool(kind):
    """Host images (uploaded through the ring, straddling slots) and device images with a
    padded row pitch, in one launch: every row equals the numpy reference to a level
    (float32 vs float64), and commit takes no byte from cupy's default pool."""
    import cupy

    from pipeline.ops.base import eager
    from pipeline.ops.resize_crop import RESIZE_CROP, target_attrs
    from pipeline.resize_plan import Target

    rng = np.random.default_rng(5)
    t = Target(224, 224, 3, kind)
    shapes = [(300, 451), (512, 512), (97, 301), (224, 224), (700, 256), (1, 900)]
    host = [rng.integers(0, 256, (*s, 3), dtype=np.uint8) for s in shapes]
    for h in host:
        h[: h.shape[0] // 2] //= 3
    padded = cupy.asarray(rng.integers(0, 256, (120, 200, 3), dtype=np.uint8))
    dev = padded[:, :150]  # rows 600 bytes apart, 450 used: read through the pitch
    imgs = [*host, dev]
    f = _fitter(slot_bytes=1 << 20, slots=3)  # 1.9 MiB of host images over 1 MiB slots
    out, lease = f.output(t, len(imgs))
    p = f.prepare(t, imgs, out)  # warm-up: the kernel is compiled here
    lease.after = f.commit(p)
    f.compute.synchronize()
    for _ in range(5000):  # the watcher hands the first fit's slots back
        if f.ring.available() == 3:
            break
        time.sleep(0.001)
    default = cupy.get_default_memory_pool()
    used, total = default.used_bytes(), default.total_bytes()
    in_use = f.pool.bytes_in_use
    p = f.prepare(t, imgs, out)
    assert f.pool.bytes_in_use == in_use + p.reservation.nbytes
    assert len(p.slots) == p.staging.slots == 2  # the images straddle two 1 MiB slots
    lease.after = f.commit(p)
    assert (default.used_bytes(), default.total_bytes()) == (used, total)  # nothing outside
    f.compute.synchronize()
    got = out.get()
    want = eager(RESIZE_CROP, *host, dev.get(), **target_attrs(t))[0]
    diff = np.abs(got.astype(np.int16) - want)
    print(f"{kind}: GPU vs numpy reference max |diff| {diff.max()}, mean {diff.mean():.5f}")
    assert diff.max() <= 1 and diff.mean() < 0.01
    f.watcher.close()  # finishes what it watched: slots and the staging bytes come back
    assert f.ring.available() == 3 and f.pool.bytes_in_use == in_use
    assert p.out is None  # a committed fit, done, holds nothing of the batch
    del out, lease, got
    assert f.pool.bytes_in_use == 0


def test_gpu_batch_matches_cpu_decode_for_photos_jpeg_and_png():
    import skimage.data as d

    core = _stage()
    assert core.decoder is None  # preprocess.decoder: cpu -- JPEGs on CPU threads, even here
    target = model_info("resnet50").target()
    blobs = []
    for name in ("chelsea", "astronaut", "coffee", "rocket"):
        img = getattr(d, name)()
        blobs += [(encode_jpeg(img), "image/jpeg"), (encode_png(img), "image/png")]
    imgs = [core.cpu.decode_one("resnet50", b, ct) for b, ct in blobs]
    # 2 x 1 MB slots: the PNGs (up to 786 KB decoded) make the call go up in parts
    assert len(core.fitter.parts(target, imgs)[0]) > 1
    out, keep, refused = core.batch("resnet50", imgs)
    core.stream.synchronize()
    assert keep == list(range(len(blobs))) and not refused
    got = out.get()
    assert got.shape == (len(blobs), 224, 224, 3) and got.dtype == np.uint8
    for i, (b, ct) in enumerate(blobs):
        want = decode(b, ct, target, 1 << 30)
        diff = np.abs(got[i].astype(np.int16) - want.astype(np.int16))
        # the same filter as Pillow's; Pillow rounds to uint8 between its two passes
        assert diff.mean() < 0.5 and np.percentile(diff, 99.9) <= 2, (i, diff.mean(), diff.max())
    core.close()


@pytest.mark.parametrize(
    "overlap_rounds,priority", [(False, "normal"), (True, "normal"), (False, "high")]
)
def test_local_form_batches_digits_through_the_scheduler(overlap_rounds, priority):
    """Ten calls of 20 share rounds, and every row is the CPU reference's -- also where a
    round's rows are handed on before its GPU work is done (``overlap_rounds``: they are
    complete by the time the call returns them), and on high-priority streams."""
    import asyncio

    import cupy

    from pipeline.models import digits

    core = _stage(overlap_rounds=overlap_rounds, stream_priority=priority)
    _, _, xte, _ = digits.load_split()
    big = np.repeat(np.repeat(xte[:200], 2, axis=1), 2, axis=2)
    from pipeline.stages.messages import Encoded

    t = core.targets["digits"]
    pngs = [(encode_png(x), "image/png") for x in big]
    items = [Encoded.checked(b, ct, t, 1 << 24, 1 << 30) for b, ct in pngs]  # as the ingress
    sizes = []
    run = core.scheduler.run_batch

    async def counted(batch):
        sizes.append(len(batch))
        return await run(batch)

    core.scheduler.run_batch = counted

    async def calls():
        return await asyncio.gather(
            *(core.process("digits", items[i : i + 20]) for i in range(0, 200, 20))
        )

    results = asyncio.run(calls())
    target = model_info("digits").target()
    want = np.stack([decode(b, ct, target, 1 << 20) for b, ct in pngs])
    got = np.concatenate([cupy.stack(r.data).get() for r in results])
    assert sum(sizes) == 200 and len(sizes) < 10, sizes  # calls shared batches
    assert all(r.owner == list(range(20)) and not r.errors for r in results)
    diff = np.abs(got.astype(np.int16) - want)
    assert diff.mean() < 0.5 and diff.max() <= 2, (diff.mean(), diff.max())
    del results
    # the batches' bytes are back with their rows gone -- once the completion thread, which
    # releases a lease after its event, has run (a hang guard, not a speed bound)
    until = time.monotonic() + 30.0
    while core.pool.bytes_in_use and time.monotonic() < until:
        time.sleep(0.01)
    assert core.pool.bytes_in_use == 0
    core.close()


def test_gpu_fit_of_extreme_strips_is_bounded_and_matches_cpu():
    """Strips of 60000x1 (CPU-decoded, uploaded through the ring; 3 x 150,000 straddles
    both 1 MB slots) are fitted by their plan's output window: the pool holds the output
    and the staging, not the 15,360,000 x 256 resize, and the pixels match the CPU."""
    import cupy

    core = _stage()
    target = model_info("resnet50").target()
    rng = np.random.default_rng(0)
    blobs, refused = [], []
    for shape in ((1, 60000), (60000, 1), (3, 150_000), (1, 200_000)):
        img = rng.integers(0, 255, (*shape, 3), dtype=np.uint8)
        some = [(encode_png(img), "image/png")]
        if max(shape) <= 65500:  # JPEG's own limit on a side
            some.append((encode_jpeg(img), "image/jpeg"))
        (refused if shape == (1, 200_000) else blobs).extend(some)
    imgs = [core.cpu.decode_one("resnet50", b, ct) for b, ct in blobs]
    default = cupy.get_default_memory_pool()
    before = default.total_bytes()
    out, keep, _ = core.batch("resnet50", imgs)
    assert core.pool.stats().high_water_bytes < 8 << 20
    core.stream.synchronize()
    assert default.total_bytes() == before
    for i, (b, ct) in enumerate(blobs):
        want = decode(b, ct, target, 1 << 30)
        diff = np.abs(out[keep.index(i)].get().astype(np.int16) - want.astype(np.int16))
        assert diff.mean() < 0.5 and np.percentile(diff, 99.9) <= 2, (i, diff.mean())
    # a 1 x 200,000 strip's centre crop is past the plan's exact geometry: a 400 on both paths
    from pipeline.errors import InvalidInput

    for b, ct in refused:
        with pytest.raises(InvalidInput, match="aspect ratio"):
            core.cpu.decode_one("resnet50", b, ct)
    core.close()


def _cuda_priority(stream) -> int:
    """The stream's priority as the driver reports it (cuStreamGetPriority)."""
    import ctypes

    got = ctypes.c_int(99)
    rc = ctypes.CDLL("libcuda.so.1").cuStreamGetPriority(
        ctypes.c_void_p(stream.ptr), ctypes.byref(got)
    )
    assert rc == 0, rc
    return got.value


def test_stream_priority_high_gives_the_decode_and_fit_streams_the_greatest_priority():
    """``preprocess.stream_priority: high``: both of the stage's streams at the device's
    greatest priority (CUDA clamps the asked -1000 to it); ``normal``: CUDA's default, 0;
    the executor's streams stay at 0 either way."""
    import ctypes

    from pipeline.device import Backend, StreamSet

    high, normal = _stage(stream_priority="high"), _stage()  # (a current context now)
    least, greatest = ctypes.c_int(), ctypes.c_int()
    rc = ctypes.CDLL("libcuda.so.1").cuCtxGetStreamPriorityRange(
        ctypes.byref(least), ctypes.byref(greatest)
    )
    assert rc == 0 and greatest.value < least.value == 0, (rc, least.value, greatest.value)
    assert _cuda_priority(high.stream) == _cuda_priority(high.fitter.copy) == greatest.value
    assert _cuda_priority(normal.stream) == _cuda_priority(normal.fitter.copy) == 0
    streams = StreamSet(Backend("cupy"))
    assert {_cuda_priority(s) for s in (streams.h2d, *streams.compute, streams.d2h)} == {0}
    high.close()
    normal.close()
