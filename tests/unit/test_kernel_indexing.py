"""The index arithmetic the new ops' CUDA kernels do, replayed in Python from the plans they
get (no GPU here): broadcasting strides, transpose strides, block copies of concat/slice."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.ops.base import TensorSpec
from pipeline.ops.binary import BINARY, MAX_RANK
from pipeline.ops.layout import TRANSPOSE, _axis_split


def _binary_like_the_kernel(a: np.ndarray, b: np.ndarray, plan) -> np.ndarray:
    shape, sa, sb = plan.detail
    dims = list(zip(shape, sa, sb, strict=True))[::-1]  # innermost first, as launched
    assert len(dims) <= MAX_RANK
    out = np.empty(int(np.prod(plan.outputs[0].shape)), np.float32)
    fa, fb = a.reshape(-1), b.reshape(-1)
    for i in range(out.size):
        t, ia, ib = i, 0, 0
        for d, xa, xb in dims:
            c = t % d
            t //= d
            ia += c * xa
            ib += c * xb
        out[i] = fa[ia] + fb[ib]
    return out.reshape(plan.outputs[0].shape)


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((2, 3, 4, 5), (2, 1, 1, 5)),
        ((2, 3, 4, 5), (1, 1, 1, 5)),
        ((2, 3, 4, 5), (5,)),
        ((2, 3, 4, 5), (2, 3, 4, 5)),
        ((2, 1, 4, 1), (2, 3, 1, 5)),
        ((2, 5), (1,)),
        ((3, 1), (1, 4)),
    ],
)
def test_binary_broadcast_strides(sa, sb):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(sa).astype(np.float32), rng.standard_normal(sb).astype(np.float32)
    plan = BINARY.prepare(TensorSpec(sa, "float32"), TensorSpec(sb, "float32"), kind="add")
    np.testing.assert_array_equal(_binary_like_the_kernel(a, b, plan), a + b)


@pytest.mark.parametrize(
    "shape,perm",
    [
        ((2, 3, 4, 5), (0, 2, 3, 1)),
        ((2, 4, 5, 3), (0, 3, 1, 2)),
        ((2, 3, 3, 2, 4), (0, 1, 2, 4, 3)),
        ((3, 4), (1, 0)),
    ],
)
def test_transpose_strides(shape, perm):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    plan = TRANSPOSE.prepare(TensorSpec(shape, "float32"), perm=perm)
    out = np.empty(x.size, np.float32)
    flat = x.reshape(-1)
    for i in range(out.size):
        t, src = i, 0
        for d, s in plan.detail:  # innermost first, as launched
            src += (t % d) * s
            t //= d
        out[i] = flat[src]
    np.testing.assert_array_equal(out.reshape(plan.outputs[0].shape), x.transpose(perm))


def _copy_block(src, dst, outer, mid, inner, s_mid, s_off, d_mid, d_off):
    for i in range(outer * mid * inner):
        k, t = i % inner, i // inner
        m, o = t % mid, t // mid
        dst[(o * d_mid + d_off + m) * inner + k] = src[(o * s_mid + s_off + m) * inner + k]


def test_concat_and_slice_block_copies():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 3, 4, 2)), rng.standard_normal((2, 3, 4, 5))
    y = np.zeros((2, 3, 4, 7))
    outer, inner = _axis_split(y.shape, 3)
    _copy_block(a.reshape(-1), y.reshape(-1), outer, 2, inner, 2, 0, 7, 0)
    _copy_block(b.reshape(-1), y.reshape(-1), outer, 5, inner, 5, 0, 7, 2)
    np.testing.assert_array_equal(y, np.concatenate([a, b], axis=3))
    s = np.zeros((2, 1, 4, 7))
    outer, inner = _axis_split(y.shape, 1)
    _copy_block(y.reshape(-1), s.reshape(-1), outer, 1, inner, 3, 2, 1, 0)
    np.testing.assert_array_equal(s, y[:, 2:3])
