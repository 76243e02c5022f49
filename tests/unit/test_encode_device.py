"""The device answerer (``tasks.encode_device``) on the numpy backend: the same path the GPU
runs -- windows staged through its pinned ring, resized by ``ResizeCrop`` into batches
reserved from the pool, one batch per answer size -- with the CPU encoder at the end. Its
JPEGs must be byte for byte the CPU path's (the same op resizes both), whatever the mix of
sizes, qualities and media types in a call; the pool must get every byte back; a pool with
no room leaves the answers to the CPU path instead of failing them."""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import pytest
from PIL import Image

from pipeline.config import ModelConfig, PipelineConfig
from pipeline.device import Backend
from pipeline.engines.base import ImageInput, TensorInfo
from pipeline.errors import FerryError
from pipeline.memory import make_pool
from pipeline.models.repository import ModelCard
from pipeline.tasks.answers import TaskContext, answer_tasks
from pipeline.tasks.encode_device import DeviceAnswers
from pipeline.tasks.options import for_image, parse_options
from pipeline.tasks.spec import resolve_task

CPU = Backend("numpy")


class _Spec:
    def __init__(self, task, options):
        self.kind, self.task, self.options = "image", task, options


def _task(resize="fit", size=32):
    entry = ModelConfig.model_validate(
        {"name": "m", "engine": "onnx", "source": "/m.onnx", "task": "image"}
    )
    card = ModelCard(
        "m", "onnx", ImageInput(size, size, 3, (0.5,) * 3, (0.25,) * 3, "nchw", resize),
        "float32", None, None,
    )  # fmt: skip
    return resolve_task(entry, card, (TensorInfo("o", "float32", (-1, 3, size, size)),))


def _call(task, asks):
    """The pixels of a call (uint8 [N, S, S, 3], as the epilogue leaves them) and its specs:
    ``asks`` is (source height, width, media type, query) per request."""
    rng = np.random.default_rng(7)
    px = rng.integers(0, 256, (len(asks), task.height, task.width, 3), dtype=np.uint8)
    px[:, 8:20, 8:20] = 240  # some structure for the encoder, beside the noise
    specs = []
    for h, w, fmt, query in asks:
        o = for_image(parse_options("image", query, fmt), h, w, fmt.split("/")[1])
        specs.append(_Spec(task, o))
    return px, specs


def _answers(task, px, specs, device):
    ctx = TaskContext({"m": str}, {}, None, device)
    rows = {r: [r] for r in range(len(specs))}
    return answer_tasks(ctx, (px,), specs, rows, set(), on_device=True)


def _device(limit=64 << 20, **kw):
    return DeviceAnswers(CPU, make_pool(CPU, limit_bytes=limit), threads=2, timeout_s=0.5, **kw)


def _idle(dev) -> bool:
    """Nothing of the device path held: no pool bytes, every ring slot free."""
    ring = dev.fitter.ring
    return dev.pool.bytes_in_use == 0 and ring.available() == ring.slots


ASKS = [
    (100, 200, "image/jpeg", {}),  # letterboxed: a window of the output, resized up
    (100, 200, "image/jpeg", {"quality": "70"}),  # the same size, another quality
    (48, 40, "image/jpeg", {}),  # another size: its own batch
    (64, 64, "image/png", {}),  # not a JPEG: the CPU encodes it in the same call
    (90, 70, "image/jpeg", {"size": "model"}),  # the model's size: no resize
    (30, 30, "image/jpeg", {}),  # smaller than the output: resized down
]


def test_the_device_path_answers_the_cpu_paths_bytes_for_a_mixed_call():
    task = _task()
    px, specs = _call(task, ASKS)
    want = _answers(task, px, specs, None)
    dev = _device()
    try:
        before = dev.pool.stats().reservations  # (the start's proof of the encoder: 2)
        got = _answers(task, px, specs, dev)
        st = dev.pool.stats()
        # the five JPEGs went the device's way: a batch per answer size (4) and the staging
        # of each batch's windows (4); every byte came back
        assert st.reservations - before == 8 and st.refused == 0 and _idle(dev)
    finally:
        dev.close()
    for r, (h, w, fmt, query) in enumerate(ASKS):
        assert not isinstance(got[r], FerryError), got[r]
        assert got[r].media_type == fmt and got[r].media == want[r].media, r
        img = Image.open(io.BytesIO(got[r].media))
        size = (task.width, task.height) if query.get("size") == "model" else (w, h)
        assert img.size == size and img.format == fmt.split("/")[1].upper()


def test_a_pool_without_room_leaves_the_answers_to_the_cpu():
    task = _task()
    px, specs = _call(task, ASKS[:3])
    want = _answers(task, px, specs, None)
    dev = _device(limit=1 << 16)  # 64 KiB: not one 100x200 RGB answer
    try:
        got = _answers(task, px, specs, dev)
        st = dev.pool.stats()
        assert st.refused >= 1 and _idle(dev)  # tried, refused, nothing held
    finally:
        dev.close()
    assert [g.media for g in got.values()] == [w.media for w in want.values()]


def test_a_call_refused_midway_gives_back_what_its_first_size_took():
    task = _task()
    asks = [(30, 30, "image/jpeg", {}), (600, 600, "image/jpeg", {})]  # 4 KiB, then 1 MiB
    px, specs = _call(task, asks)
    want = _answers(task, px, specs, None)
    dev = _device(limit=512 << 10)
    try:
        before = dev.pool.stats()
        got = _answers(task, px, specs, dev)
        st = dev.pool.stats()
        # the first size's batch and staging were reserved and committed, the second's
        # batch refused: the call went the CPU's way and nothing stays held
        assert st.reservations - before.reservations >= 2 and st.refused == 1 and _idle(dev)
    finally:
        dev.close()
    assert [g.media for g in got.values()] == [w.media for w in want.values()]


def test_a_window_the_ring_cannot_stage_is_left_to_the_cpu_and_the_rest_is_not():
    task = _task(size=128)  # a whole output is 48 KiB; the ring holds 2 x 16 KiB
    asks = [(128, 128, "image/jpeg", {}), (100, 400, "image/jpeg", {})]  # 48, then 12 KiB
    px, specs = _call(task, asks)
    want = _answers(task, px, specs, None)
    dev = _device(ring_slot_bytes=16 << 10)
    try:
        before = dev.pool.stats().reservations
        got = _answers(task, px, specs, dev)
        assert dev.pool.stats().reservations - before == 2 and _idle(dev)  # the second's
    finally:
        dev.close()
    assert [g.media for g in got.values()] == [w.media for w in want.values()]


def test_jpegs_groups_by_size_and_quality_and_keeps_the_order():
    dev = _device()
    try:
        rng = np.random.default_rng(3)
        wins = [rng.integers(0, 256, (16, 24, c), dtype=np.uint8) for c in (3, 3, 1, 3)]
        sizes = [(32, 48), (16, 24), (32, 48), (32, 48)]
        got = dev.jpegs(wins, sizes, [90, 90, 90, 50])
        assert dev.jpegs([], [], []) == []
    finally:
        dev.close()
    for b, (h, w), win in zip(got, sizes, wins, strict=True):
        img = Image.open(io.BytesIO(b))
        assert img.size == (w, h) and img.mode == ("L" if win.shape[2] == 1 else "RGB")
    assert len(got[3]) < len(got[0])  # quality 50 against 90, the same size


def test_a_device_path_that_cannot_start_answers_on_the_cpu_under_auto_and_fails_when_asked():
    try:
        import nvidia.nvimgcodec  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("nvImageCodec loads here: its set-up would not fail for want of it")
    gpu = Backend("cupy")  # a GPU backend on a machine without nvImageCodec: set-up fails
    lazy = DeviceAnswers(gpu, None, eager=False, strict=False)  # ``auto``: at first use
    win = np.zeros((8, 8, 3), np.uint8)
    assert lazy.jpegs([win, win], [(16, 16), (8, 8)], [90, 90]) == [None, None]
    assert lazy.failed and "Error" in lazy.failed and lazy.fitter is None  # (said once)
    assert lazy.jpegs([win], [(16, 16)], [90]) == [None]  # it does not try again
    with pytest.raises((ImportError, RuntimeError)):  # ``nvimgcodec`` asked: the start fails
        DeviceAnswers(gpu, None)


def test_make_builds_none_on_the_cpu_and_the_setting_is_checked():
    class Executor:
        backend, pool = CPU, None

    cfg = PipelineConfig.model_validate({"preprocess": {"encoder": "nvimgcodec"}})
    assert DeviceAnswers.make(cfg, Executor()) is None  # the CPU path answers there
    if importlib.util.find_spec("nvidia") is None:  # a GPU replica without the extra
        Executor.backend = Backend("cupy")
        with pytest.raises(FerryError, match="preprocess.encoder is 'nvimgcodec'.*gpu-decode"):
            DeviceAnswers.make(cfg, Executor())
        auto = PipelineConfig.model_validate({"preprocess": {"encoder": "auto"}})
        assert DeviceAnswers.make(auto, Executor()) is None
    with pytest.raises(Exception, match="encoder"):
        PipelineConfig.model_validate({"preprocess": {"encoder": "libjpeg-on-a-toaster"}})
