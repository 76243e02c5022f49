"""Every op against a plain numpy reference, on the CPU backend."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.errors import InvalidInput
from pipeline.ops import (
    ADD_RELU,
    BIAS_ACT,
    CONV2D,
    GEMM,
    GLOBAL_AVG_POOL,
    MAXPOOL2D,
    NORMALIZE,
    RESHAPE,
    SOFTMAX,
    TOPK,
    TensorSpec,
    weights_to_matrix,
)
from pipeline.ops.base import eager
from tests.reference import conv2d_direct, maxpool_direct, softmax_ref

rng = np.random.default_rng(1234)

CONV_CASES = [
    # n, h, w, c, cout, k, stride, pad
    (2, 7, 9, 3, 5, 3, 1, 1),  # odd sizes, scalar im2col
    (2, 8, 8, 8, 4, 3, 2, 1),  # stride 2, vector im2col
    (1, 5, 6, 16, 8, 1, 1, 0),  # 1x1 as a GEMM
    (2, 9, 7, 8, 6, 1, 2, 0),  # 1x1 stride 2 (ResNet v1.5 downsample)
    (2, 15, 13, 3, 8, 7, 2, 3),  # the 7x7 stride-2 stem on 3 channels
    (1, 6, 6, 4, 3, 3, 1, 0),  # no padding
    (1, 4, 4, 2, 2, 5, 1, 2),  # kernel larger than half the image
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: "n{}h{}w{}c{}o{}k{}s{}p{}".format(*c))
@pytest.mark.parametrize("residual", [False, True])
def test_conv2d_matches_direct_loops(case, residual):
    n, h, w, c, cout, k, s, p = case
    x = rng.standard_normal((n, h, w, c)).astype(np.float32)
    w_oihw = rng.standard_normal((cout, c, k, k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    ref = conv2d_direct(x, w_oihw, b, s, p)
    args = [x, weights_to_matrix(w_oihw), b]
    if residual:
        r = rng.standard_normal(ref.shape).astype(np.float32)
        args.append(r)
        ref = ref + r
    ref = np.maximum(ref, 0)
    # a small workspace forces the chunked path
    (out,) = eager(
        CONV2D,
        *args,
        kernel=(k, k),
        stride=s,
        padding=p,
        act="relu",
        target="host",
        max_workspace_bytes=2048,
    )
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def test_conv2d_plan_reports_cost_and_workspace():
    plan = CONV2D.prepare(
        TensorSpec((2, 8, 8, 8), "float16"),
        TensorSpec((72, 16), "float16"),
        TensorSpec((16,), "float32"),
        kernel=3,
        stride=1,
        padding=1,
    )
    assert plan.outputs == (TensorSpec((2, 8, 8, 16), "float16"),)
    m = 2 * 8 * 8
    assert plan.flops == 2 * m * 16 * 72
    assert plan.workspace_bytes == m * 72 * 2  # the whole column matrix fits under the cap
    direct = CONV2D.prepare(
        TensorSpec((2, 8, 8, 8), "float16"),
        TensorSpec((8, 16), "float16"),
        TensorSpec((16,), "float32"),
        kernel=1,
    )
    assert direct.workspace_bytes == 0 and direct.detail.direct


def test_conv2d_chunks_bound_the_workspace():
    big = CONV2D.prepare(
        TensorSpec((256, 224, 224, 3), "float16"),
        TensorSpec((152, 64), "float16"),
        TensorSpec((64,), "float32"),
        kernel=7,
        stride=2,
        padding=3,
        max_workspace_bytes=64 << 20,
    )
    assert big.workspace_bytes <= 64 << 20
    assert big.detail.rows_per_chunk < big.detail.m


@pytest.mark.parametrize(
    "specs, attrs, field",
    [
        (
            (
                TensorSpec((2, 8, 8), "float32"),
                TensorSpec((72, 4), "float32"),
                TensorSpec((4,), "float32"),
            ),
            {"kernel": 3},
            "shape",
        ),
        (
            (
                TensorSpec((2, 8, 8, 8), "int32"),
                TensorSpec((72, 4), "int32"),
                TensorSpec((4,), "float32"),
            ),
            {"kernel": 3},
            "dtype",
        ),
        (
            (
                TensorSpec((2, 8, 8, 8), "float32"),
                TensorSpec((70, 4), "float32"),
                TensorSpec((4,), "float32"),
            ),
            {"kernel": 3},
            "expected_rows",
        ),
        (
            (
                TensorSpec((2, 8, 8, 8), "float32"),
                TensorSpec((72, 4), "float32"),
                TensorSpec((5,), "float32"),
            ),
            {"kernel": 3},
            "bias",
        ),
        (
            (
                TensorSpec((2, 2, 2, 8), "float32"),
                TensorSpec((200, 4), "float32"),
                TensorSpec((4,), "float32"),
            ),
            {"kernel": 5},
            "kernel",
        ),
        (
            (
                TensorSpec((2, 8, 8, 8), "float32"),
                TensorSpec((72, 4), "float32"),
                TensorSpec((4,), "float32"),
            ),
            {"kernel": 3, "stride": 0},
            "stride",
        ),
        (
            (
                TensorSpec((2, 8, 8, 8), "float32"),
                TensorSpec((72, 4), "float32"),
                TensorSpec((4,), "float32"),
            ),
            {"kernel": 3, "act": "mish"},
            "act",
        ),
    ],
)
def test_conv2d_rejects_bad_specs_naming_the_values(specs, attrs, field):
    with pytest.raises(InvalidInput) as info:
        CONV2D.prepare(*specs, **attrs)
    assert field in info.value.fields


def test_prepare_is_cached_by_specs_and_attrs():
    specs = (TensorSpec((4, 8), "float32"), TensorSpec((8, 3), "float32"))
    a = GEMM.prepare(*specs, act="relu")
    b = GEMM.prepare(*specs, act="relu")
    c = GEMM.prepare(*specs, act="none")
    assert a is b and a is not c


def test_prepare_rejects_wrong_arity_and_non_specs():
    with pytest.raises(InvalidInput):
        GEMM.prepare(TensorSpec((4, 8), "float32"))
    with pytest.raises(InvalidInput):
        GEMM.prepare(np.zeros((4, 8)), np.zeros((8, 3)))


def test_gemm_with_bias_and_relu():
    a = rng.standard_normal((5, 7)).astype(np.float32)
    b = rng.standard_normal((7, 3)).astype(np.float32)
    bias = rng.standard_normal(3).astype(np.float32)
    (out,) = eager(GEMM, a, b, bias, act="relu")
    np.testing.assert_allclose(
        out, np.maximum(a.astype(np.float64) @ b + bias, 0), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(InvalidInput) as info:
        GEMM.prepare(TensorSpec((5, 7), "float32"), TensorSpec((6, 3), "float32"))
    assert info.value.fields["a"] == (5, 7)


def test_bias_act_and_add_relu():
    x = rng.standard_normal((2, 3, 3, 8)).astype(np.float32)
    r = rng.standard_normal(x.shape).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    (y,) = eager(BIAS_ACT, x, b, r, act="relu")
    np.testing.assert_allclose(y, np.maximum(x + b + r, 0), rtol=1e-6)
    (y,) = eager(BIAS_ACT, x, b, act="none")
    np.testing.assert_allclose(y, x + b, rtol=1e-6)
    (y,) = eager(ADD_RELU, x, r)
    np.testing.assert_allclose(y, np.maximum(x + r, 0), rtol=1e-6)
    with pytest.raises(InvalidInput):
        ADD_RELU.prepare(TensorSpec((2, 3), "float32"), TensorSpec((3, 2), "float32"))


@pytest.mark.parametrize("k, s, p, hw", [(3, 2, 1, (9, 8)), (2, 2, 0, (6, 6)), (3, 1, 1, (5, 7))])
def test_maxpool_matches_loops(k, s, p, hw):
    x = rng.standard_normal((2, *hw, 5)).astype(np.float32)
    (y,) = eager(MAXPOOL2D, x, kernel=k, stride=s, padding=p)
    np.testing.assert_array_equal(y, maxpool_direct(x, k, s, p))


def test_global_avg_pool():
    x = rng.standard_normal((3, 7, 5, 6)).astype(np.float32)
    (y,) = eager(GLOBAL_AVG_POOL, x)
    np.testing.assert_allclose(y, x.astype(np.float64).mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)


def test_softmax_rows_sum_to_one():
    x = (rng.standard_normal((4, 1000)) * 10).astype(np.float32)
    (y,) = eager(SOFTMAX, x)
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, softmax_ref(x), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(y.sum(axis=1), 1.0, rtol=1e-5)


def test_topk_order_ties_and_nan():
    x = np.array(
        [[1.0, 5.0, 5.0, 3.0, np.nan, 4.0], [0.0, -1.0, 2.0, 2.0, 2.0, 1.0]], dtype=np.float32
    )
    vals, idx = eager(TOPK, x, k=3)
    np.testing.assert_array_equal(idx, [[1, 2, 5], [2, 3, 4]])
    np.testing.assert_array_equal(vals, [[5, 5, 4], [2, 2, 2]])
    with pytest.raises(InvalidInput) as info:
        TOPK.prepare(TensorSpec((2, 6), "float32"), k=7)
    assert info.value.fields["k"] == 7


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_normalize(layout):
    x = rng.integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    (y,) = eager(
        NORMALIZE,
        x,
        mean=mean,
        std=std,
        layout=layout,
        dtype="float32",
        pad_channels=4 if layout == "nhwc" else 3,
    )
    ref = (x / 255.0 - np.array(mean)) / np.array(std)
    if layout == "nhwc":
        np.testing.assert_allclose(y[..., :3], ref, rtol=1e-5, atol=1e-5)
        assert np.all(y[..., 3] == 0)
    else:
        np.testing.assert_allclose(y, ref.transpose(0, 3, 1, 2), rtol=1e-5, atol=1e-5)
    with pytest.raises(InvalidInput):
        NORMALIZE.prepare(TensorSpec((2, 4, 5, 3), "float32"))
    with pytest.raises(InvalidInput):
        NORMALIZE.prepare(TensorSpec((2, 4, 5, 3), "uint8"), std=(1.0, 0.0, 1.0))


def test_reshape_view_and_checks():
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    (y,) = eager(RESHAPE, x, shape=(2, -1))
    np.testing.assert_array_equal(y, x.reshape(2, 12))
    with pytest.raises(InvalidInput):
        RESHAPE.prepare(TensorSpec((2, 3, 4), "float32"), shape=(5, -1))


@pytest.mark.parametrize("k", [1, 5, 8, 9, 64])
def test_topk_of_wide_rows_is_the_stable_sorts_prefix(k):
    # 1000 classes with NaN take the partition path; coarse values force
    # ties at the k-th key in some rows (those take the full sort), NaN, -inf and +inf test
    # the ends of the order
    x = np.round(rng.standard_normal((64, 1000)) * 3).astype(np.float32)
    x[1] = np.nan
    x[2, ::3] = np.nan
    x[3] = -np.inf
    x[8, ::2] = -np.inf
    x[8, 1::4] = np.nan
    x[9, 10:20] = np.inf
    x[4:8] = rng.standard_normal((4, 1000)).astype(np.float32)  # no ties
    vals, idx = eager(TOPK, x, k=k)
    key = np.where(np.isnan(x), np.inf, -x)
    want = np.argsort(key, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(idx, want)
    np.testing.assert_array_equal(vals, np.take_along_axis(x, want, axis=1))


# ---------------------------------------------------------------------- transformer ops
def test_matmul_of_two_tensors_batched_and_broadcast():
    from pipeline.ops.matmul import MATMUL

    a = rng.standard_normal((2, 3, 5, 4)).astype(np.float32)
    b = rng.standard_normal((2, 3, 4, 6)).astype(np.float32)
    (y,) = eager(MATMUL, a, b)
    ref = np.zeros((2, 3, 5, 6))
    for i, j, m, n in np.ndindex(*ref.shape):
        ref[i, j, m, n] = sum(float(a[i, j, m, k]) * float(b[i, j, k, n]) for k in range(4))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    (y1,) = eager(MATMUL, a, b[:1, :1])  # one side all 1: its matrix repeats (stride 0)
    np.testing.assert_allclose(y1, a @ np.broadcast_to(b[:1, :1], b.shape), rtol=1e-5)
    plan = MATMUL.prepare(TensorSpec.of(a), TensorSpec.of(b[:1, :1]))
    assert plan.detail == (6, 5, 6, 4, 20, 0)
    with pytest.raises(InvalidInput, match="leading dimensions"):
        MATMUL.prepare(TensorSpec((2, 3, 5, 4), "float32"), TensorSpec((3, 2, 4, 6), "float32"))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_over_any_axis_keeps_the_dtype(axis):
    from pipeline.ops.softmax_axis import SOFTMAX_AXIS

    x = (rng.standard_normal((3, 4, 5)) * 4).astype(np.float32)
    (y,) = eager(SOFTMAX_AXIS, x, axis=axis)
    moved = np.moveaxis(x, axis, -1)
    ref = np.moveaxis(
        softmax_ref(moved.reshape(-1, moved.shape[-1])).reshape(moved.shape), -1, axis
    )
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-7)
    (h,) = eager(SOFTMAX_AXIS, x.astype(np.float16), axis=axis)
    assert h.dtype == np.float16


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_against_index_mapping(mode):
    from pipeline.ops.pad import PAD

    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    pads = ((0, 0), (2, 1), (1, 3))
    (y,) = eager(PAD, x, pads=pads, mode=mode, value=7.0)
    assert y.shape == (2, 6, 8)

    def src(c: int, size: int) -> int | None:
        if 0 <= c < size:
            return c
        if mode == "constant":
            return None
        if mode == "edge":
            return min(max(c, 0), size - 1)
        return -c if c < 0 else 2 * (size - 1) - c

    for i, j, k in np.ndindex(*y.shape):
        sj, sk = src(j - 2, 3), src(k - 1, 4)
        want = 7.0 if sj is None or sk is None else x[i, sj, sk]
        assert y[i, j, k] == np.float32(want), (i, j, k)
    with pytest.raises(InvalidInput):
        PAD.prepare(TensorSpec.of(x), pads=((0, 0), (-1, 0), (0, 0)))


def test_expand_takes_the_batch_from_its_ref():
    from pipeline.ops.expand import EXPAND

    token = rng.standard_normal((1, 1, 6)).astype(np.float32)
    ref = np.zeros((4, 3, 8, 8), np.uint8)  # the graph's input: only its first dim is read
    (y,) = eager(EXPAND, token, ref, shape=(-1, 1, 6), batch_k=1)
    assert y.shape == (4, 1, 6)
    for i in range(4):
        np.testing.assert_array_equal(y[i], token[0])
    (z,) = eager(EXPAND, rng.standard_normal((2, 1, 3)).astype(np.float32), shape=(2, 5, 3))
    assert z.shape == (2, 5, 3) and (z == z[:, :1]).all()


def test_slice_with_a_step():
    from pipeline.ops.layout import SLICE

    x = rng.standard_normal((2, 7, 3)).astype(np.float32)
    (y,) = eager(SLICE, x, axis=1, start=1, stop=7, step=2)
    np.testing.assert_array_equal(y, np.stack([x[:, 1], x[:, 3], x[:, 5]], axis=1))


@pytest.mark.parametrize("own", [True, False])
@pytest.mark.parametrize("k", [1, 5, 8, 9])
def test_top_k_rows_of_an_owned_matrix_is_the_stable_sorts_prefix_and_leaves_it_as_it_was(k, own):
    from pipeline.ops.softmax import softmax_rows, top_k_rows

    x = np.round(rng.standard_normal((64, 1000)) * 3).astype(np.float32)  # ties
    x[4:8] = softmax_rows(rng.standard_normal((4, 1000)))
    for m in (x, np.where(np.arange(1000) % 7 == 0, np.nan, x).astype(np.float32)):
        before = m.copy()  # (the second has NaN: the general path, NaN last)
        vals, idx = top_k_rows(m, k, own=own)
        key = np.where(np.isnan(before), np.inf, -before)
        want = np.argsort(key, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(idx, want)
        np.testing.assert_array_equal(vals, np.take_along_axis(before, want, axis=1))
        assert idx.dtype == np.int32 and vals.dtype == np.float32
        np.testing.assert_array_equal(m, before)  # given back as it was
