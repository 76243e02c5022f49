"""Softmax over any axis, in the input's dtype (attention's scores; statistics in float).

The tensor is seen as [outer, C, inner] around the axis. On the GPU: the last axis
(inner = 1) one warp per row; any other axis one thread per (outer, inner) column.
``softmax`` (the classifier head's, float32 out) stays the op for a model's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype, check_positive

SOURCE = r"""
__device__ __forceinline__ float sa_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
__device__ __forceinline__ float sa_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// one warp per row of C; blockDim.x == 256 (8 rows a block)
extern "C" __global__ void softmax_last(const T* __restrict__ x, T* __restrict__ y,
    long long rows, int C) {
  long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  float m = -FERRY_INF;
  for (int i = lane; i < C; i += 32) m = fmaxf(m, tof(xr[i]));
  m = sa_warp_max(m);
  float s = 0.f;
  for (int i = lane; i < C; i += 32) s += __expf(tof(xr[i]) - m);
  float inv = 1.f / sa_warp_sum(s);
  for (int i = lane; i < C; i += 32) yr[i] = fromf(__expf(tof(xr[i]) - m) * inv);
}

// one thread per (outer, inner) column of C elements, stride inner
extern "C" __global__ void softmax_strided(const T* __restrict__ x, T* __restrict__ y,
    long long cols, int C, long long inner) {
  FERRY_FOR(i, cols) {
    long long o = i / inner, j = i % inner;
    const T* xc = x + o * C * inner + j;
    T* yc = y + o * C * inner + j;
    float m = -FERRY_INF;
    for (int c = 0; c < C; ++c) m = fmaxf(m, tof(xc[c * inner]));
    float s = 0.f;
    for (int c = 0; c < C; ++c) s += __expf(tof(xc[c * inner]) - m);
    float inv = 1.f / s;
    for (int c = 0; c < C; ++c) yc[c * inner] = fromf(__expf(tof(xc[c * inner]) - m) * inv);
  }
}
"""


class SoftmaxAxis(Op):
    """y = softmax(x, axis) with y in x's dtype; attribute ``axis`` (negative counts back)."""

    name = "softmax_axis"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        check_positive(self.name, "x", x)
        r = len(x.shape)
        axis = int(attrs.get("axis", -1))
        axis = axis + r if axis < 0 else axis
        if not 0 <= axis < r:
            raise InvalidInput("softmax_axis: axis out of range", axis=attrs.get("axis"), rank=r)
        outer = int(np.prod(x.shape[:axis], dtype=np.int64))
        inner = int(np.prod(x.shape[axis + 1 :], dtype=np.int64))
        return OpPlan(
            self.name,
            specs,
            (x,),
            0,
            flops=x.size * 5,
            bytes_moved=2 * x.nbytes,
            attrs=(("axis", axis),),
            detail=(outer, x.shape[axis], inner),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        axis = plan.attr("axis")
        x = inputs[0].astype(np.float32, copy=False)
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        e /= np.sum(e, axis=axis, keepdims=True)
        outputs[0][...] = e

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        outer, c, inner = plan.detail
        x, y = inputs[0], outputs[0]
        if inner == 1:
            kern = _cuda.kernel(SOURCE, "softmax_last", x.dtype)
            kern(((outer + 7) // 8,), (256,), (x, y, np.int64(outer), np.int32(c)))
        else:
            kern = _cuda.kernel(SOURCE, "softmax_strided", x.dtype)
            cols = outer * inner
            _cuda.launch(kern, cols, (x, y, np.int64(cols), np.int32(c), np.int64(inner)))


SOFTMAX_AXIS = SoftmaxAxis()
