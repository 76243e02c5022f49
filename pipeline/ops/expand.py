"""Expand (ONNX ``Expand``, numpy broadcasting to a larger shape) as a strided copy.

A constant expanded to a batch-dependent shape (ViT's class token, ``[1, 1, E]`` to
``[N, 1, E]``) takes its batch from a second input, ``ref``, whose first dimension is the
batch: the target ``shape`` has -1 where ``batch_k`` times that size goes. Broadcast
dimensions are merged at plan time, as ``binary`` merges them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype
from .binary import MAX_RANK, broadcast_plan

SOURCE = r"""
// dims innermost first: (size, stride of x) x 6
extern "C" __global__ void expand_bcast(const T* __restrict__ x, T* __restrict__ y,
    long long total, int rank,
    long long d0, long long a0, long long d1, long long a1, long long d2, long long a2,
    long long d3, long long a3, long long d4, long long a4, long long d5, long long a5) {
  const long long dd[6] = {d0, d1, d2, d3, d4, d5};
  const long long sa[6] = {a0, a1, a2, a3, a4, a5};
  FERRY_FOR(i, total) {
    long long t = i, src = 0;
    for (int k = 0; k < rank; ++k) { src += (t % dd[k]) * sa[k]; t /= dd[k]; }
    y[i] = x[src];
  }
}
"""


class Expand(Op):
    """y = broadcast_to(x, shape); inputs (x) or (x, ref); attributes ``shape``, ``batch_k``."""

    name = "expand"
    n_inputs = (1, 2)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        x = specs[0]
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        shape = [int(d) for d in attrs.get("shape", ())]
        if shape.count(-1) > (1 if len(specs) == 2 else 0):
            raise InvalidInput("expand: -1 (the batch) needs a ref input, once", shape=shape)
        if -1 in shape:
            shape[shape.index(-1)] = int(attrs.get("batch_k", 1)) * specs[1].shape[0]
        out, dims, st_x, _ = broadcast_plan(x.shape, tuple(shape))
        if out != tuple(shape):
            raise InvalidInput("expand: x does not broadcast to the shape", x=x.shape, shape=shape)
        o = TensorSpec(out, x.dtype)
        return OpPlan(
            self.name,
            specs,
            (o,),
            0,
            bytes_moved=x.nbytes + o.nbytes,
            attrs=(("batch_k", int(attrs.get("batch_k", 1))), ("shape", tuple(shape))),
            detail=(dims, st_x),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        y = outputs[0]
        y[...] = np.broadcast_to(inputs[0], y.shape)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        dims, st_x = plan.detail
        args: list[Any] = []
        for k in range(MAX_RANK - 1, -1, -1):  # innermost first
            j = k - (MAX_RANK - len(dims))
            args += [np.int64(dims[j]), np.int64(st_x[j])] if j >= 0 else [np.int64(1), np.int64(0)]
        y = outputs[0]
        kern = _cuda.kernel(SOURCE, "expand_bcast", y.dtype)
        total = int(y.size)
        _cuda.launch(kern, total, (inputs[0], y, np.int64(total), np.int32(len(dims)), *args))


EXPAND = Expand()
