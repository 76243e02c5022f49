"""Every op on the GPU against its numpy result, fp32 and fp16; the pool under 50 threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from pipeline.device import Backend, Stream
from pipeline.memory.pinned import PinnedRing
from pipeline.memory.pool import CupyPool
from pipeline.ops import (
    ADD_RELU,
    BIAS_ACT,
    CONV2D,
    GEMM,
    GLOBAL_AVG_POOL,
    MAXPOOL2D,
    NORMALIZE,
    SOFTMAX,
    TOPK,
    TensorSpec,
    weights_to_matrix,
)
from pipeline.ops.base import eager

pytestmark = pytest.mark.gpu
GPU = Backend("cupy")
TOL = {"float32": 2e-5, "float16": 1e-2}


def cp():
    import cupy

    return cupy


def rel_err(got, ref) -> float:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert np.isfinite(got).all()
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-12))


def on_gpu(op, *host_arrays, dtype="float32", **attrs):
    dev = [
        cp().asarray(a.astype(dtype) if a.dtype.kind == "f" and a.ndim > 1 else a)
        for a in host_arrays
    ]
    outs = eager(op, *dev, **attrs)
    return [o.get() for o in outs]


def on_host(op, *host_arrays, **attrs):
    attrs = {**attrs, "target": "host"} if op is CONV2D else attrs
    return list(eager(op, *host_arrays, **attrs))


CONV_SHAPES = [
    (2, 15, 13, 3, 64, 7, 2, 3),  # stem (gathering im2col)
    (4, 14, 14, 64, 64, 3, 1, 1),  # 3x3 (vector im2col)
    (4, 14, 14, 128, 128, 3, 2, 1),  # 3x3 stride 2
    (4, 7, 7, 256, 512, 1, 1, 0),  # 1x1 as GEMM
    (4, 14, 14, 256, 512, 1, 2, 0),  # downsample
    (3, 9, 11, 16, 24, 3, 1, 1),  # odd sizes
]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda c: "n{}h{}w{}c{}o{}k{}s{}p{}".format(*c))
def test_conv2d_gpu_matches_numpy(shape, dtype):
    n, h, w, c, cout, k, s, p = shape
    rng = np.random.default_rng(7)
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    wt = (rng.standard_normal((cout, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    res = rng.standard_normal((n, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1, cout)).astype(
        np.float32
    )
    wm = weights_to_matrix(wt)
    (ref,) = on_host(CONV2D, x, wm, b, res, kernel=k, stride=s, padding=p, act="relu")
    # a small workspace cap forces chunks on the GPU path too
    (got,) = on_gpu(
        CONV2D,
        x,
        wm,
        b,
        res,
        dtype=dtype,
        kernel=k,
        stride=s,
        padding=p,
        act="relu",
        max_workspace_bytes=1 << 16,
    )
    assert rel_err(got, ref) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gemm_bias_act_add_relu_gpu(dtype):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((33, 64)).astype(np.float32)
    bm = rng.standard_normal((64, 40)).astype(np.float32)
    bias = rng.standard_normal(40).astype(np.float32)
    (ref,) = on_host(GEMM, a, bm, bias, act="relu")
    (got,) = on_gpu(GEMM, a, bm, bias, dtype=dtype, act="relu")
    assert rel_err(got, ref) < TOL[dtype]
    x = rng.standard_normal((2, 5, 5, 24)).astype(np.float32)
    r = rng.standard_normal(x.shape).astype(np.float32)
    bb = rng.standard_normal(24).astype(np.float32)
    assert (
        rel_err(on_gpu(BIAS_ACT, x, bb, r, dtype=dtype)[0], on_host(BIAS_ACT, x, bb, r)[0])
        < TOL[dtype]
    )
    odd = rng.standard_normal((3, 7)).astype(np.float32)  # 7 channels: the scalar kernel
    ob = rng.standard_normal(7).astype(np.float32)
    assert (
        rel_err(on_gpu(BIAS_ACT, odd, ob, dtype=dtype)[0], on_host(BIAS_ACT, odd, ob)[0])
        < TOL[dtype]
    )
    assert rel_err(on_gpu(ADD_RELU, x, r, dtype=dtype)[0], on_host(ADD_RELU, x, r)[0]) < TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_pools_softmax_topk_gpu(dtype):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3, 17, 15, 32)).astype(np.float32)
    assert (
        rel_err(
            on_gpu(MAXPOOL2D, x, dtype=dtype, kernel=3, stride=2, padding=1)[0],
            on_host(MAXPOOL2D, x, kernel=3, stride=2, padding=1)[0],
        )
        < TOL[dtype]
    )
    assert (
        rel_err(on_gpu(GLOBAL_AVG_POOL, x, dtype=dtype)[0], on_host(GLOBAL_AVG_POOL, x)[0])
        < TOL[dtype]
    )
    logits = (rng.standard_normal((5, 1000)) * 4).astype(np.float32)
    assert (
        rel_err(on_gpu(SOFTMAX, logits, dtype=dtype)[0], on_host(SOFTMAX, logits)[0]) < TOL[dtype]
    )
    lg = logits.astype(dtype).astype(np.float32)  # what the GPU sees, so the order is comparable
    vals, idx = on_gpu(TOPK, lg, dtype=dtype, k=5)
    rv, ri = on_host(TOPK, lg, k=5)
    np.testing.assert_array_equal(idx, ri)
    np.testing.assert_allclose(vals, rv, rtol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_image_ops_gpu(dtype):
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (2, 31, 45, 3), dtype=np.uint8)
    for layout, pad in (("nhwc", 4), ("nchw", 3)):
        got = on_gpu(
            NORMALIZE,
            img,
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            layout=layout,
            dtype=dtype,
            pad_channels=pad,
        )[0]
        ref = on_host(
            NORMALIZE,
            img,
            mean=(0.485, 0.456, 0.406),
            std=(0.229, 0.224, 0.225),
            layout=layout,
            dtype="float32",
            pad_channels=pad,
        )[0]
        assert rel_err(got, ref) < TOL[dtype]
    # the resize (ops.resize_crop) is tested through GpuFitter: tests/gpu/test_preprocess_gpu.py


def test_pinned_ring_on_the_device():
    ring = PinnedRing(GPU, 1 << 20, 2)
    slot = ring.acquire()
    assert slot.host.nbytes >= 1 << 20
    cupy = cp()
    slot.view(0, (16,), np.float32)[:] = np.arange(16)
    dev = cupy.empty((16,), dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    dev.set(slot.view(0, (16,), np.float32), stream=stream)  # async: the source is page-locked
    stream.synchronize()
    np.testing.assert_array_equal((dev * 2).get(), np.arange(16) * 2)
    slot.release()
    ring.close()


def test_50_threads_reserving_and_committing():
    """No error, bytes in use back to zero, no driver allocation after the warm-up round."""
    cupy = cp()
    pool = CupyPool(GPU, 8 << 30)
    spec_x = TensorSpec((8, 28, 28, 64), "float16")
    wm = cupy.asarray(
        (np.random.default_rng(0).standard_normal((576, 64)) * 0.05).astype(np.float16)
    )
    b = cupy.zeros(64, dtype=cupy.float32)
    plan = CONV2D.prepare(
        spec_x, TensorSpec.of(wm), TensorSpec.of(b), kernel=3, padding=1, act="relu"
    )
    need = spec_x.nbytes + plan.outputs[0].nbytes + plan.workspace_bytes
    x_host = np.random.default_rng(1).standard_normal(spec_x.shape).astype(np.float16)
    ref = None
    errors: list[BaseException] = []
    outs: list[np.ndarray] = []
    lock = threading.Lock()

    def worker(barrier):
        try:
            stream = Stream("t", GPU)
            barrier.wait()
            for _ in range(4):
                with pool.reserve(need) as r:
                    buf = r.buffer
                    x = buf[: spec_x.nbytes].view(cupy.float16).reshape(spec_x.shape)
                    out = (
                        buf[spec_x.nbytes : spec_x.nbytes + plan.outputs[0].nbytes]
                        .view(cupy.float16)
                        .reshape(plan.outputs[0].shape)
                    )
                    ws = buf[spec_x.nbytes + plan.outputs[0].nbytes :]
                    x.set(x_host, stream=stream.raw)
                    CONV2D.commit(plan, (x, wm, b), (out,), ws, stream)
                    stream.synchronize()  # the reservation must outlive the work
                    res = out.get(stream=stream.raw)
                    stream.synchronize()
                with lock:
                    outs.append(res)
            stream.close()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for round_ in range(2):
        barrier = threading.Barrier(50)
        threads = [threading.Thread(target=worker, args=(barrier,)) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors[:3]
        if round_ == 0:
            after_warmup = pool.stats().driver_allocs
    s = pool.stats()
    assert s.bytes_in_use == 0
    assert s.driver_allocs == after_warmup, (s.driver_allocs, after_warmup)
    assert s.reservations == 2 * 50 * 4
    ref = outs[0]
    for o in outs:
        np.testing.assert_array_equal(o, ref)
