"""General 2-D pooling in NHWC and a mean over contiguous axes.

``pool2d``: max or average over (kh, kw) windows with strides, asymmetric pads
(top, left, bottom, right) and ``ceil_mode`` (PyTorch's rule: a last window that would
start in the bottom/right padding is dropped). Average pooling divides by the window's
elements inside the input (``count_include_pad`` false) or inside the padded input
(true); padding never takes part in a max. ``pool.py``'s square max pool (the native
ResNet-50's) is this op with its attributes.

``reduce_mean``: the mean over axes ``[a0, a1)`` of x, seen as [outer, R, inner]; the
output drops those axes (a global average pool over H, W of NHWC is axes [1, 3)).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import (
    FLOAT_DTYPES,
    Op,
    OpPlan,
    TensorSpec,
    check_dtype,
    check_positive,
    check_tensor,
)

SOURCE = r"""
extern "C" __global__ void pool2d_nhwc(const T* __restrict__ x, T* __restrict__ y,
    long long total, int H, int W, int C, int KH, int KW, int SH, int SW, int PT, int PL,
    int PB, int PR, int OH, int OW, int is_max, int include_pad) {
  FERRY_FOR(i, total) {
    const NhwcIdx q = nhwc_index(i, OH, OW, C);
    const int c = q.c, ow = q.ow, oh = q.oh;
    const long long n = q.n;
    int h0 = oh * SH - PT, w0 = ow * SW - PL;
    int h1 = min(h0 + KH, H + PB), w1 = min(w0 + KW, W + PR);
    int padded = (h1 - h0) * (w1 - w0);
    int hs = max(h0, 0), ws = max(w0, 0), he = min(h1, H), we = min(w1, W);
    float acc = is_max ? -FERRY_INF : 0.f;
    for (int ih = hs; ih < he; ++ih)
      for (int iw = ws; iw < we; ++iw) {
        float v = tof(x[((n * H + ih) * W + iw) * (long long)C + c]);
        acc = is_max ? fmaxf(acc, v) : acc + v;
      }
    if (!is_max) {
      int cnt = include_pad ? padded : (he - hs) * (we - ws);
      acc = cnt > 0 ? acc / cnt : 0.f;
    }
    y[i] = fromf(acc);
  }
}

extern "C" __global__ void mean_mid(const T* __restrict__ x, T* __restrict__ y,
    long long outer, long long R, long long inner) {
  const long long total = outer * inner;
  FERRY_FOR(i, total) {
    long long k = i % inner, o = i / inner;
    const T* p = x + o * R * inner + k;
    float s = 0.f;
    for (long long j = 0; j < R; ++j) s += tof(p[j * inner]);
    y[i] = fromf(s / (float)R);
  }
}
"""


def pool_out_size(size: int, k: int, s: int, p0: int, p1: int, ceil: bool) -> int:
    span = size + p0 + p1 - k
    o = (-(-span // s) if ceil else span // s) + 1
    if ceil and (o - 1) * s >= size + p0:
        o -= 1
    return o


class Pool2d(Op):
    name = "pool2d"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 4, FLOAT_DTYPES)
        kind = attrs.get("kind", "max")
        if kind not in ("max", "avg"):
            raise InvalidInput("pool2d: kind must be 'max' or 'avg'", kind=kind)
        kh, kw = (int(v) for v in attrs.get("kernel", (1, 1)))
        sh, sw = (int(v) for v in attrs.get("stride", (1, 1)))
        pads = tuple(int(v) for v in attrs.get("pads", (0, 0, 0, 0)))
        ceil = bool(attrs.get("ceil_mode", False))
        include = bool(attrs.get("count_include_pad", False))
        if min(kh, kw, sh, sw) < 1 or len(pads) != 4 or min(pads) < 0:
            raise InvalidInput("pool2d: bad geometry", kernel=(kh, kw), stride=(sh, sw), pads=pads)
        pt, pl, pb, pr = pads
        if pt >= kh or pb >= kh or pl >= kw or pr >= kw:
            raise InvalidInput("pool2d: padding must be smaller than the kernel", pads=pads)
        n, h, w, c = x.shape
        oh = pool_out_size(h, kh, sh, pt, pb, ceil)
        ow = pool_out_size(w, kw, sw, pl, pr, ceil)
        if oh < 1 or ow < 1:
            raise InvalidInput("pool2d: the window does not fit", input_hw=(h, w), kernel=(kh, kw))
        out = TensorSpec((n, oh, ow, c), x.dtype)
        geo = (h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow)
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=out.size * kh * kw,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(
                ("ceil_mode", ceil),
                ("count_include_pad", include),
                ("kernel", (kh, kw)),
                ("kind", kind),
                ("pads", pads),
                ("stride", (sh, sw)),
            ),
            detail=geo,
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        x, y = inputs[0], outputs[0]
        h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow = plan.detail
        is_max = plan.attr("kind") == "max"
        include = plan.attr("count_include_pad")
        y.fill(-np.inf if is_max else 0)
        for i in range(kh):
            for j in range(kw):
                oh0, oh1 = _valid(i, sh, pt, h, oh)
                ow0, ow1 = _valid(j, sw, pl, w, ow)
                if oh1 <= oh0 or ow1 <= ow0:
                    continue
                ih0, iw0 = oh0 * sh - pt + i, ow0 * sw - pl + j
                src = x[
                    :,
                    ih0 : ih0 + (oh1 - oh0 - 1) * sh + 1 : sh,
                    iw0 : iw0 + (ow1 - ow0 - 1) * sw + 1 : sw,
                    :,
                ]
                dst = y[:, oh0:oh1, ow0:ow1, :]
                if is_max:
                    np.maximum(dst, src, out=dst)
                else:
                    np.add(dst, src, out=dst)
        if not is_max:
            y /= _counts(h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, include)[None, :, :, None]

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        _run_pool_cuda(plan, inputs[0], outputs[0])


def _valid(kk: int, s: int, p: int, size: int, out_size: int) -> tuple[int, int]:
    """Output positions o with 0 <= o*s - p + kk < size, as [o0, o1)."""
    o0 = max(0, -(-(p - kk) // s))
    o1 = min(out_size, (size - 1 + p - kk) // s + 1)
    return o0, o1


def _counts(h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, include) -> np.ndarray:  # noqa: ANN001
    def axis(size: int, k: int, s: int, p0: int, p1: int, o: int) -> np.ndarray:
        start = np.arange(o) * s - p0
        end = np.minimum(start + k, size + p1)
        if not include:
            start, end = np.maximum(start, 0), np.minimum(end, size)
        return (end - start).astype(np.float32)

    cnt = np.outer(axis(h, kh, sh, pt, pb, oh), axis(w, kw, sw, pl, pr, ow))
    return np.maximum(cnt, 1)


def _run_pool_cuda(plan: OpPlan, x: Any, y: Any) -> None:
    h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow = plan.detail
    kern = _cuda.kernel(SOURCE, "pool2d_nhwc", x.dtype)
    total = int(y.size)
    i32 = np.int32
    _cuda.launch(
        kern,
        total,
        (
            x,
            y,
            np.int64(total),
            *(i32(v) for v in (h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow)),
            i32(plan.attr("kind") == "max"),
            i32(bool(plan.attr("count_include_pad"))),
        ),
    )


class ReduceMean(Op):
    """Mean over the contiguous axes [a0, a1) (attribute ``axes`` = (a0, a1)), dropped."""

    name = "reduce_mean"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        check_positive(self.name, "x", x)
        a0, a1 = (int(v) for v in attrs.get("axes", (0, 0)))
        r = len(x.shape)
        if not 0 <= a0 < a1 <= r:
            raise InvalidInput("reduce_mean: axes must be a range [a0, a1)", axes=(a0, a1), rank=r)
        outer = int(np.prod(x.shape[:a0], dtype=np.int64))
        red = int(np.prod(x.shape[a0:a1], dtype=np.int64))
        inner = int(np.prod(x.shape[a1:], dtype=np.int64))
        out = TensorSpec(x.shape[:a0] + x.shape[a1:], x.dtype)
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=x.size,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(("axes", (a0, a1)),),
            detail=(outer, red, inner),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        outer, red, inner = plan.detail
        x = inputs[0].reshape(outer, red, inner)
        outputs[0].reshape(outer, inner)[...] = np.mean(x, axis=1, dtype=np.float32)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        outer, red, inner = plan.detail
        kern = _cuda.kernel(SOURCE, "mean_mid", inputs[0].dtype)
        _cuda.launch(
            kern,
            outer * inner,
            (inputs[0], outputs[0], np.int64(outer), np.int64(red), np.int64(inner)),
        )


POOL2D = Pool2d()
REDUCE_MEAN = ReduceMean()
