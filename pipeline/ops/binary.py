"""Elementwise add, sub, mul, div with numpy broadcasting, and an optional activation after.

Both inputs have the compute dtype. Broadcast dimensions are merged at plan time (a
squeeze-excite scale [N, 1, 1, C] against [N, H, W, C] becomes [N, H*W, C] with a zero
stride), so the kernel walks at most 6 dimensions with per-operand strides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .activation import ACT_DEVICE, ACTIVATIONS, apply_act_host, check_act
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype

MAX_RANK = 6
KINDS = {"add": 0, "sub": 1, "mul": 2, "div": 3}

SOURCE = (
    ACT_DEVICE
    + r"""
// dims come by value, innermost first: (size, stride of a, stride of b) x 6
extern "C" __global__ void binary_bcast(const T* __restrict__ a, const T* __restrict__ b,
    T* __restrict__ y, long long total, int rank, int kind, int act, float p0, float p1,
    long long d0, long long a0, long long b0, long long d1, long long a1, long long b1,
    long long d2, long long a2, long long b2, long long d3, long long a3, long long b3,
    long long d4, long long a4, long long b4, long long d5, long long a5, long long b5) {
  const long long dd[6] = {d0, d1, d2, d3, d4, d5};
  const long long sa[6] = {a0, a1, a2, a3, a4, a5};
  const long long sb[6] = {b0, b1, b2, b3, b4, b5};
  FERRY_FOR(i, total) {
    long long t = i, ia = 0, ib = 0;
    for (int k = 0; k < rank; ++k) {
      long long c = t % dd[k];
      t /= dd[k];
      ia += c * sa[k];
      ib += c * sb[k];
    }
    float u = tof(a[ia]), v = tof(b[ib]), r;
    switch (kind) {
      case 0: r = u + v; break;
      case 1: r = u - v; break;
      case 2: r = u * v; break;
      default: r = u / v; break;
    }
    y[i] = fromf(ferry_act(r, act, p0, p1));
  }
}
"""
)


def broadcast_plan(
    sa: tuple[int, ...], sb: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(output shape, merged shape, element strides of a, of b) for numpy broadcasting."""
    try:
        out = tuple(np.broadcast_shapes(sa, sb))
    except ValueError:
        raise InvalidInput("shapes do not broadcast", a=sa, b=sb) from None
    r = len(out)
    pa = (1,) * (r - len(sa)) + tuple(sa)
    pb = (1,) * (r - len(sb)) + tuple(sb)

    def strides(p: tuple[int, ...]) -> list[int]:
        st, acc = [0] * r, 1
        for k in range(r - 1, -1, -1):
            st[k] = acc if p[k] != 1 else 0
            acc *= p[k]
        return st

    st_a, st_b = strides(pa), strides(pb)
    dims: list[list[int]] = []  # [size, stride_a, stride_b], merged where contiguous
    for k in range(r):
        if out[k] == 1:
            continue
        if dims:
            size, xa, xb = dims[-1]
            if st_a[k] * out[k] == xa and st_b[k] * out[k] == xb:
                dims[-1] = [size * out[k], st_a[k], st_b[k]]
                continue
        dims.append([out[k], st_a[k], st_b[k]])
    if not dims:
        dims = [[1, 0, 0]]
    if len(dims) > MAX_RANK:
        raise InvalidInput("broadcast needs too many dimensions", a=sa, b=sb, max_rank=MAX_RANK)
    return (
        out,
        tuple(d[0] for d in dims),
        tuple(d[1] for d in dims),
        tuple(d[2] for d in dims),
    )


class Binary(Op):
    """y = act(a <kind> b); attributes ``kind`` (add, sub, mul, div), ``act``, ``alpha``, ``beta``."""

    name = "binary"
    n_inputs = (2, 2)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        a, b = specs
        check_dtype(self.name, "a", a, FLOAT_DTYPES)
        if a.dtype != b.dtype:
            raise InvalidInput("binary: inputs must share a dtype", a=a.dtype, b=b.dtype)
        kind = attrs.get("kind")
        if kind not in KINDS:
            raise InvalidInput("binary: unknown kind", kind=kind, supported=tuple(KINDS))
        act, p0, p1 = check_act(self.name, attrs)
        out, shape, st_a, st_b = broadcast_plan(a.shape, b.shape)
        o = TensorSpec(out, a.dtype)
        return OpPlan(
            self.name,
            specs,
            (o,),
            0,
            flops=o.size,
            bytes_moved=a.nbytes + b.nbytes + o.nbytes,
            attrs=(("act", act), ("alpha", p0), ("beta", p1), ("kind", kind)),
            detail=(shape, st_a, st_b),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        fn = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}
        y = outputs[0]
        fn[plan.attr("kind")](inputs[0], inputs[1], out=y)
        apply_act_host(y, plan.attr("act"), plan.attr("alpha"), plan.attr("beta"))

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        shape, st_a, st_b = plan.detail
        dims: list[Any] = []
        for k in range(MAX_RANK - 1, -1, -1):  # innermost first
            j = k - (MAX_RANK - len(shape))
            if j >= 0:
                dims += [np.int64(shape[j]), np.int64(st_a[j]), np.int64(st_b[j])]
            else:
                dims += [np.int64(1), np.int64(0), np.int64(0)]
        y = outputs[0]
        kern = _cuda.kernel(SOURCE, "binary_bcast", y.dtype)
        total = int(y.size)
        _cuda.launch(
            kern,
            total,
            (
                inputs[0],
                inputs[1],
                y,
                np.int64(total),
                np.int32(len(shape)),
                np.int32(KINDS[plan.attr("kind")]),
                np.int32(ACTIVATIONS[plan.attr("act")]),
                np.float32(plan.attr("alpha")),
                np.float32(plan.attr("beta")),
                *dims,
            ),
        )


BINARY = Binary()
