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


def _conv_like_the_kernels(x: np.ndarray, w: np.ndarray, plan) -> np.ndarray:
    """dwconv_nhwc, or im2col_grouped + one strided GEMM per group, as _run_cuda launches them."""
    g = plan.detail
    flat = x.reshape(-1)
    out = np.zeros(g.m * g.cout, np.float64)
    if g.depthwise:
        wf = w.reshape(-1)
        for i in range(out.size):
            c, t = i % g.c, i // g.c
            ow, t = t % g.ow, t // g.ow
            oh, n = t % g.oh, t // g.oh
            acc = 0.0
            for kh in range(g.kh):
                ih = oh * g.sh - g.pt + kh * g.dh
                if not 0 <= ih < g.h:
                    continue
                for kw in range(g.kw):
                    iw = ow * g.sw - g.pl + kw * g.dw
                    if 0 <= iw < g.w:
                        acc += (
                            flat[((n * g.h + ih) * g.w + iw) * g.c + c]
                            * wf[(kh * g.kw + kw) * g.c + c]
                        )
            out[i] = acc
        return out.reshape(g.n, g.oh, g.ow, g.cout)
    cg, cog = g.c // g.groups, g.cout // g.groups
    k_all, kg = g.kh * g.kw * g.c, g.kh * g.kw * cg
    cols = np.zeros(g.m * k_all)
    for i in range(cols.size):
        r, k = i // k_all, i % k_all
        c_, t = k % cg, k // cg
        kw, t = t % g.kw, t // g.kw
        kh, gi = t % g.kh, t // g.kh
        ow, t2 = r % g.ow, r // g.ow
        oh, n = t2 % g.oh, t2 // g.oh
        ih, iw = oh * g.sh - g.pt + kh * g.dh, ow * g.sw - g.pl + kw * g.dw
        if 0 <= ih < g.h and 0 <= iw < g.w:
            cols[i] = flat[((n * g.h + ih) * g.w + iw) * g.c + gi * cg + c_]
    wf = w.reshape(-1)
    for gi in range(
        g.groups
    ):  # C[m, n] at c_off, ldc = cout; A at gi*kg, lda = k_all; B at gi*kg*cog
        for r in range(g.m):
            for o in range(cog):
                out[r * g.cout + gi * cog + o] = sum(
                    cols[r * k_all + gi * kg + k] * wf[gi * kg * cog + k * cog + o]
                    for k in range(kg)
                )
    return out.reshape(g.n, g.oh, g.ow, g.cout)


@pytest.mark.parametrize(
    "c,cout,k,stride,dil,pads,groups",
    [
        (4, 4, 3, 2, 1, (1, 0, 2, 1), 4),
        (3, 3, 3, 1, 2, (2, 2, 2, 2), 3),
        (4, 6, 3, 1, 1, (1, 1, 1, 1), 2),
        (4, 4, 2, 2, 1, (0, 1, 1, 0), 1),
    ],
)
def test_grouped_conv_kernels(c, cout, k, stride, dil, pads, groups):
    from pipeline.ops.conv_grouped import CONV2D_GROUPED, grouped_weights

    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 6, c)).astype(np.float32)
    w_oihw = rng.standard_normal((cout, c // groups, k, k)).astype(np.float32)
    w = grouped_weights(w_oihw, groups)
    specs = (TensorSpec.of(x), TensorSpec.of(w), TensorSpec((cout,), "float32"))
    attrs = dict(kernel=(k, k), stride=stride, dilation=dil, pads=pads, groups=groups)
    cuda_plan = CONV2D_GROUPED.prepare(*specs, target="cuda", **attrs)
    from pipeline.ops.base import eager

    want = eager(CONV2D_GROUPED, x, w, np.zeros(cout, np.float32), target="host", **attrs)[0]
    np.testing.assert_allclose(_conv_like_the_kernels(x, w, cuda_plan), want, rtol=1e-5, atol=1e-5)
