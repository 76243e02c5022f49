"""Image answers resized and JPEG-encoded on the GPU (``tasks.encode_device``, nvImageCodec's
CUDA encoder) against the CPU path's pixels: each answer decodes (libjpeg-turbo) to its size
and to within JPEG's loss of the exact resize (``ResizeCrop``'s numpy path, which the CPU
answers use): at most 1.5x, plus a little, what the CPU answers' encoder loses on the same
pixels at the same quality; a call's batches come from the pool and go back to it; and a call of 64
1280x720 answers of a 256x256 output, the image workload's shape, is timed for the log."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pipeline.device import select_backend
from pipeline.memory import make_pool
from pipeline.ops.base import eager
from pipeline.ops.resize_crop import RESIZE_CROP
from pipeline.tasks.encode import encode_one

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device():
    pytest.importorskip("nvidia.nvimgcodec")
    from pipeline.tasks.encode_device import DeviceAnswers

    backend = select_backend("cupy", 0, "sleep")
    dev = DeviceAnswers(backend, make_pool(backend, limit_bytes=1 << 30), threads=2)
    yield dev
    dev.close()


def _photo(h: int, w: int, c: int = 3) -> np.ndarray:
    import skimage.data as d

    img = d.astronaut() if c == 3 else d.camera()[..., None]
    (out,) = eager(RESIZE_CROP, np.ascontiguousarray(img), height=h, width=w, channels=c)
    return out[0]


def _in_use(dev, wait_s: float = 2.0) -> int:
    end = time.monotonic() + wait_s  # a batch's bytes return once its last work has run
    while dev.pool.bytes_in_use and time.monotonic() < end:
        time.sleep(0.01)
    return dev.pool.bytes_in_use


def test_gpu_jpegs_decode_to_the_cpu_resize_within_jpegs_loss(device):
    import simplejpeg

    wins = [_photo(256, 256), _photo(200, 256), _photo(256, 256, 1), _photo(64, 48)]
    sizes = [(720, 1280), (300, 451), (512, 512), (64, 48)]
    qualities = [90, 90, 90, 75]
    got = device.jpegs(wins, sizes, qualities)
    for b, win, (h, w), q in zip(got, wins, sizes, qualities, strict=True):
        assert b is not None and b[:2] == b"\xff\xd8", "not a JPEG"
        c = win.shape[2]
        dec = simplejpeg.decode_jpeg(b, colorspace="GRAY" if c == 1 else "RGB")
        (want,) = eager(RESIZE_CROP, win, height=h, width=w, channels=c)
        diff = np.abs(dec.reshape(h, w, c).astype(np.int16) - want[0])
        # JPEG's own loss on these pixels at this quality: the CPU answers' encoder (4:4:4)
        ref = simplejpeg.decode_jpeg(
            encode_one(want[0], "image/jpeg", q), colorspace="GRAY" if c == 1 else "RGB"
        )
        loss = np.abs(ref.reshape(h, w, c).astype(np.int16) - want[0])
        print(
            f"{w}x{h}x{c} q{q}: {len(b)} bytes, mean |diff| {diff.mean():.2f} "
            f"(the CPU encoder's {loss.mean():.2f}), p99 {np.percentile(diff, 99)} "
            f"({np.percentile(loss, 99)})"
        )
        assert dec.reshape(h, w, c).shape == (h, w, c)
        assert diff.mean() <= 1.5 * loss.mean() + 1.0
        assert np.percentile(diff, 99) <= 1.5 * np.percentile(loss, 99) + 4
    assert _in_use(device) == 0


def test_a_call_of_64_720p_answers(device):
    wins = [_photo(256, 256)] * 64
    sizes = [(720, 1280)] * 64
    device.jpegs(wins[:8], sizes[:8], [90] * 8)  # the encoder's first call sets itself up
    t = time.perf_counter()
    got = device.jpegs(wins, sizes, [90] * 64)
    ms = (time.perf_counter() - t) * 1e3
    print(f"64 answers of 1280x720 from 256x256: {ms:.1f} ms, {64e3 / ms:.0f} answers/s, "
          f"{sum(map(len, got)) / 64 / 1024:.0f} KiB each")  # fmt: skip
    assert all(b is not None for b in got)
    assert _in_use(device) == 0


def _codec_threads() -> int:
    """nvImageCodec's host threads in this process (its pools name them ``[NVIMGCODEC]...``)."""
    import os

    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().startswith("[NVIMGCODEC]")
        except OSError:  # a thread that ended meanwhile
            pass
    return n


@pytest.mark.parametrize("threads", [4, 16])
def test_a_call_of_64_720p_answers_by_the_encoders_threads(threads):
    """``preprocess.encoder_threads`` reaches nvImageCodec's encoder (``DeviceAnswers.make``:
    the process then has at least that many nvImageCodec threads), and a call of 64 720p
    answers is timed for the log on 4 threads (``threads``' default) and 16: the CUDA
    encoder waits for the GPU after each answer on each thread."""
    pytest.importorskip("nvidia.nvimgcodec")
    from types import SimpleNamespace

    from pipeline.config import PipelineConfig
    from pipeline.tasks.encode_device import DeviceAnswers

    backend = select_backend("cupy", 0, "sleep")
    executor = SimpleNamespace(backend=backend, pool=make_pool(backend, limit_bytes=1 << 30))
    cfg = PipelineConfig.model_validate(
        {"preprocess": {"encoder": "nvimgcodec", "encoder_threads": threads}}
    )
    dev = DeviceAnswers.make(cfg, executor)
    try:
        assert dev is not None and dev.threads == threads
        wins, sizes = [_photo(256, 256)] * 64, [(720, 1280)] * 64
        dev.jpegs(wins[:8], sizes[:8], [90] * 8)
        # (all of the process's: at 16, more than any other encoder or decoder here starts)
        have = _codec_threads()
        print(f"nvImageCodec threads in the process: {have} (the encoder asked for {threads})")
        assert have >= threads
        times = []
        for _ in range(3):
            t = time.perf_counter()
            got = dev.jpegs(wins, sizes, [90] * 64)
            times.append((time.perf_counter() - t) * 1e3)
            assert all(b is not None for b in got)
        ms = sorted(times)[1]
        print(f"encoder on {threads} threads: 64 answers of 1280x720 in {ms:.1f} ms (median of "
              f"3), {64e3 / ms:.0f} answers/s")  # fmt: skip
        assert _in_use(dev) == 0
    finally:
        dev.close()
