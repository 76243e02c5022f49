"""Softmax over the last axis (float32 out) and top-k (values float32, indices int32).

Top-k breaks ties by the lower index, like a stable descending sort; NaNs are never picked
ahead of numbers.
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
    check_tensor,
)

MAX_K = 64

SOURCE = r"""
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// one block of 256 threads per row
extern "C" __global__ void softmax_rows(const T* __restrict__ x, float* __restrict__ y, int C) {
  __shared__ float red[32];
  const T* xr = x + (long long)blockIdx.x * C;
  float* yr = y + (long long)blockIdx.x * C;
  int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float m = -FERRY_INF;
  for (int i = threadIdx.x; i < C; i += blockDim.x) m = fmaxf(m, tof(xr[i]));
  m = warp_max(m);
  if (lane == 0) red[wid] = m;
  __syncthreads();
  m = lane < nw ? red[lane] : -FERRY_INF;
  m = warp_max(m);
  __syncthreads();
  float s = 0.f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) s += __expf(tof(xr[i]) - m);
  s = warp_sum(s);
  if (lane == 0) red[wid] = s;
  __syncthreads();
  s = lane < nw ? red[lane] : 0.f;
  s = warp_sum(s);
  float inv = 1.f / s;
  for (int i = threadIdx.x; i < C; i += blockDim.x) yr[i] = __expf(tof(xr[i]) - m) * inv;
}

// one thread per row; k <= 64
extern "C" __global__ void topk_rows(const T* __restrict__ x, float* __restrict__ vals,
    int* __restrict__ idx, int N, int C, int k) {
  int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= N) return;
  float bv[64];
  int bi[64];
  int filled = 0;
  const T* xr = x + (long long)row * C;
  for (int c = 0; c < C; ++c) {
    float v = tof(xr[c]);
    if (v != v) continue;  // NaN
    if (filled == k && !(v > bv[k - 1])) continue;
    int j = filled < k ? filled++ : k - 1;
    while (j > 0 && v > bv[j - 1]) { bv[j] = bv[j - 1]; bi[j] = bi[j - 1]; --j; }
    bv[j] = v; bi[j] = c;
  }
  for (int j = 0; j < k; ++j) {
    vals[(long long)row * k + j] = j < filled ? bv[j] : -FERRY_INF;
    idx[(long long)row * k + j] = j < filled ? bi[j] : -1;
  }
}
"""


def softmax_rows(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Each row of the host matrix ``x`` through softmax, in float32 (into ``out`` when
    given): ``SOFTMAX``'s host kernel, callable without an op's plan where the caller has
    checked ``x`` (a 2-D float matrix)."""
    y = np.empty(x.shape, np.float32) if out is None else out
    np.subtract(x, np.max(x, axis=1, keepdims=True), out=y, dtype=np.float32)
    np.exp(y, out=y)
    y /= np.sum(y, axis=1, keepdims=True)
    return y


def top_k_rows(x: np.ndarray, k: int, own: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` largest of each row of the host matrix ``x`` and their columns, in the
    stable order (ties by column, NaN last): ``TOPK``'s host kernel, callable without an
    op's plan where the caller has checked ``x`` and ``1 <= k <= min(classes, 64)``.
    ``own``: no other thread reads ``x`` meanwhile, so a small ``k`` of finite rows is
    found in ``x`` itself (``_top_few_in_place``: it is as it was on return), else in a
    copy."""
    x = x.astype(np.float32, copy=False)
    if k <= _FEW and x.shape[1] > 64 and np.isfinite(x).all():
        return _top_few_in_place(x if own else x.copy(), k)
    key = np.where(np.isnan(x), np.inf, -x)  # NaN sorts last
    order = _top_k_stable(key, k)
    return np.take_along_axis(x, order, axis=1), order.astype(np.int32)


class Softmax(Op):
    name = "softmax"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 2, FLOAT_DTYPES)
        out = TensorSpec(x.shape, "float32")
        return OpPlan(
            self.name, specs, (out,), 0, flops=x.size * 5, bytes_moved=2 * x.nbytes + out.nbytes
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        softmax_rows(inputs[0], outputs[0])

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, y = inputs[0], outputs[0]
        n, c = x.shape
        kern = _cuda.kernel(SOURCE, "softmax_rows", x.dtype)
        kern((n,), (256,), (x, y, np.int32(c)))


_FEW = 8
"""Up to this ``k``, finite rows of more than 64 classes take ``_top_few_in_place`` (k passes
of argmax) instead of a partition of whole rows: on the 2-core VM, 64 rows of 1,000 classes
at k=5 took 0.61 ms through the partition."""


def _top_few_in_place(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``top_k_rows`` of a finite ``x`` by ``k`` passes of ``argmax`` (the first of equal
    maxima: the stable order) on ``x`` itself, each column taken set to -inf for the passes
    after it and given back its value at the end: no copy of ``x``, whose temporaries of a
    few hundred KB a call cost the loop more than the passes (page faults, on the 2-core VM
    0.58 ms for 64 rows of 1,000 classes where the passes took 0.1)."""
    n = x.shape[0]
    rows = np.arange(n)
    order = np.empty((n, k), dtype=np.intp)
    vals = np.empty((n, k), dtype=np.float32)
    taken = 0
    try:
        for j in range(k):
            col = np.argmax(x, axis=1)
            order[:, j] = col
            vals[:, j] = x[rows, col]
            x[rows, col] = -np.inf
            taken += 1
    finally:
        for j in range(taken):
            x[rows, order[:, j]] = vals[:, j]
    return vals, order.astype(np.int32)


def _top_k_stable(key: np.ndarray, k: int) -> np.ndarray:
    """The first ``k`` columns of ``argsort(key, axis=1, kind="stable")``, without sorting
    whole rows: a partition finds each row's k-th smallest key, and only the columns at or
    below it are sorted. A row with ties at that key has more than k such columns and goes
    through the full stable sort, so the answer is the stable sort's in every case."""
    n, c = key.shape
    if k >= c or c <= 64:
        return np.argsort(key, axis=1, kind="stable")[:, :k]
    kth = np.partition(key, k - 1, axis=1)[:, k - 1 : k]
    below = key <= kth  # k columns per row unless the k-th key is tied (or all NaN rows)
    exact = below.sum(axis=1) == k
    order = np.empty((n, k), dtype=np.intp)
    if exact.any():
        cols = np.nonzero(below[exact])[1].reshape(-1, k)  # ascending column order per row
        sub = np.take_along_axis(key[exact], cols, axis=1)
        order[exact] = np.take_along_axis(cols, np.argsort(sub, axis=1, kind="stable"), axis=1)
    if not exact.all():
        order[~exact] = np.argsort(key[~exact], axis=1, kind="stable")[:, :k]
    return order


class TopK(Op):
    name = "topk"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 2, FLOAT_DTYPES)
        k = attrs.get("k")
        n, c = x.shape
        if not isinstance(k, int | np.integer) or not 1 <= int(k) <= min(c, MAX_K):
            raise InvalidInput(
                "topk: k must be an integer in [1, min(classes, 64)]", k=k, classes=c
            )
        k = int(k)
        return OpPlan(
            self.name,
            specs,
            (TensorSpec((n, k), "float32"), TensorSpec((n, k), "int32")),
            0,
            flops=x.size * k,
            bytes_moved=x.nbytes + n * k * 8,
            attrs=(("k", k),),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        vals, idx = top_k_rows(inputs[0], plan.attr("k"))
        outputs[0][...] = vals
        outputs[1][...] = idx

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x = inputs[0]
        n, c = x.shape
        kern = _cuda.kernel(SOURCE, "topk_rows", x.dtype)
        threads = 128
        kern(
            ((n + threads - 1) // threads,),
            (threads,),
            (x, outputs[0], outputs[1], np.int32(n), np.int32(c), np.int32(plan.attr("k"))),
        )


SOFTMAX = Softmax()
TOPK = TopK()
