"""Pooling in NHWC: max pool (k x k, stride, padding) and global average pool -> [N, C]."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype, check_positive, check_rank

SOURCE = r"""
extern "C" __global__ void maxpool_nhwc(const T* __restrict__ x, T* __restrict__ y,
    long long total, int H, int W, int C, int K, int S, int P, int OH, int OW) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    int c = (int)(i % C);
    long long t = i / C;
    int ow = (int)(t % OW); t /= OW;
    int oh = (int)(t % OH);
    long long n = t / OH;
    float m = -FERRY_INF;
    for (int kh = 0; kh < K; ++kh) {
      int ih = oh * S - P + kh;
      if (ih < 0 || ih >= H) continue;
      for (int kw = 0; kw < K; ++kw) {
        int iw = ow * S - P + kw;
        if (iw < 0 || iw >= W) continue;
        m = fmaxf(m, tof(x[((n * H + ih) * W + iw) * C + c]));
      }
    }
    y[i] = fromf(m);
  }
}

// VEC channels per thread as one 16-byte vector (C % VEC == 0)
extern "C" __global__ void maxpool_nhwc_vec(const T* __restrict__ x, T* __restrict__ y,
    long long total_vec, int H, int W, int C, int K, int S, int P, int OH, int OW) {
  typedef VecT<VEC> V;
  const int CV = C / VEC;
  const V* xv = reinterpret_cast<const V*>(x);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total_vec;
       i += (long long)gridDim.x * blockDim.x) {
    int cv = (int)(i % CV);
    long long t = i / CV;
    int ow = (int)(t % OW); t /= OW;
    int oh = (int)(t % OH);
    long long n = t / OH;
    float m[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) m[j] = -FERRY_INF;
    for (int kh = 0; kh < K; ++kh) {
      int ih = oh * S - P + kh;
      if (ih < 0 || ih >= H) continue;
      for (int kw = 0; kw < K; ++kw) {
        int iw = ow * S - P + kw;
        if (iw < 0 || iw >= W) continue;
        V v = xv[((n * H + ih) * W + iw) * CV + cv];
#pragma unroll
        for (int j = 0; j < VEC; ++j) m[j] = fmaxf(m[j], tof(v.v[j]));
      }
    }
    V o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) o.v[j] = fromf(m[j]);
    reinterpret_cast<V*>(y)[i] = o;
  }
}

extern "C" __global__ void gap_nhwc(const T* __restrict__ x, T* __restrict__ y,
    long long total, int HW, int C) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    int c = (int)(i % C);
    long long n = i / C;
    const T* p = x + n * (long long)HW * C + c;
    float s = 0.f;
    for (int j = 0; j < HW; ++j) s += tof(p[(long long)j * C]);
    y[i] = fromf(s / HW);
  }
}
"""


def _valid_range(kk: int, s: int, p: int, size: int, out_size: int) -> tuple[int, int]:
    """Output positions o with 0 <= o*s - p + kk < size, as [o0, o1)."""
    o0 = max(0, -(-(p - kk) // s))
    o1 = min(out_size, (size - 1 + p - kk) // s + 1)
    return o0, o1


class MaxPool2d(Op):
    name = "maxpool2d"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_rank(self.name, "x", x, 4)
        check_positive(self.name, "x", x)
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        k = int(attrs.get("kernel", 3))
        s = int(attrs.get("stride", 2))
        p = int(attrs.get("padding", 1))
        if k < 1 or s < 1 or p < 0 or p > k // 2:
            raise InvalidInput(
                "maxpool2d: need kernel >= 1, stride >= 1, 0 <= padding <= kernel // 2",
                kernel=k,
                stride=s,
                padding=p,
            )
        n, h, w, c = x.shape
        oh = (h + 2 * p - k) // s + 1
        ow = (w + 2 * p - k) // s + 1
        if oh < 1 or ow < 1:
            raise InvalidInput("maxpool2d: the window does not fit", input_hw=(h, w), kernel=k)
        out = TensorSpec((n, oh, ow, c), x.dtype)
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=out.size * k * k,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(("kernel", k), ("padding", p), ("stride", s)),
            detail=(k, s, p, oh, ow),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        x, y = inputs[0], outputs[0]
        k, s, p, oh, ow = plan.detail
        y.fill(-np.inf)
        h, w = x.shape[1], x.shape[2]
        for kh in range(k):
            oh0, oh1 = _valid_range(kh, s, p, h, oh)
            for kw in range(k):
                ow0, ow1 = _valid_range(kw, s, p, w, ow)
                if oh1 <= oh0 or ow1 <= ow0:
                    continue
                ih0, iw0 = oh0 * s - p + kh, ow0 * s - p + kw
                src = x[
                    :,
                    ih0 : ih0 + (oh1 - oh0 - 1) * s + 1 : s,
                    iw0 : iw0 + (ow1 - ow0 - 1) * s + 1 : s,
                    :,
                ]
                dst = y[:, oh0:oh1, ow0:ow1, :]
                np.maximum(dst, src, out=dst)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, y = inputs[0], outputs[0]
        k, s, p, oh, ow = plan.detail
        n, h, w, c = x.shape
        kern = _cuda.kernel(SOURCE, "maxpool_nhwc", x.dtype)
        total = int(y.size)
        _cuda.launch(
            kern,
            total,
            (
                x,
                y,
                np.int64(total),
                np.int32(h),
                np.int32(w),
                np.int32(c),
                np.int32(k),
                np.int32(s),
                np.int32(p),
                np.int32(oh),
                np.int32(ow),
            ),
        )


class GlobalAvgPool(Op):
    name = "global_avg_pool"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_rank(self.name, "x", x, 4)
        check_positive(self.name, "x", x)
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        n, h, w, c = x.shape
        out = TensorSpec((n, c), x.dtype)
        return OpPlan(self.name, specs, (out,), 0, flops=x.size, bytes_moved=x.nbytes + out.nbytes)

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        outputs[0][...] = np.mean(inputs[0], axis=(1, 2), dtype=np.float32)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, y = inputs[0], outputs[0]
        n, h, w, c = x.shape
        kern = _cuda.kernel(SOURCE, "gap_nhwc", x.dtype)
        total = n * c
        _cuda.launch(kern, total, (x, y, np.int64(total), np.int32(h * w), np.int32(c)))


MAXPOOL2D = MaxPool2d()
GLOBAL_AVG_POOL = GlobalAvgPool()
