"""Pad (ONNX ``Pad``): constant, edge or reflect padding of up to 6 dimensions.

``pads`` is ((begin, end), ...) per dimension, each >= 0. On the GPU one pass over the
output: each element reads its source (or the constant) through the per-dimension map.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype, check_positive

MAX_RANK = 6
MODES = {"constant": 0, "edge": 1, "reflect": 2}

SOURCE = r"""
// dims innermost first: (output size, input size, pad before, input stride) x 6
extern "C" __global__ void pad_nd(const T* __restrict__ x, T* __restrict__ y,
    long long total, int rank, int mode, float value,
    long long o0, long long i0, long long p0, long long s0,
    long long o1, long long i1, long long p1, long long s1,
    long long o2, long long i2, long long p2, long long s2,
    long long o3, long long i3, long long p3, long long s3,
    long long o4, long long i4, long long p4, long long s4,
    long long o5, long long i5, long long p5, long long s5) {
  const long long od[6] = {o0, o1, o2, o3, o4, o5};
  const long long id[6] = {i0, i1, i2, i3, i4, i5};
  const long long pd[6] = {p0, p1, p2, p3, p4, p5};
  const long long sd[6] = {s0, s1, s2, s3, s4, s5};
  FERRY_FOR(i, total) {
    long long t = i, src = 0;
    bool inside = true;
    for (int k = 0; k < rank; ++k) {
      long long c = t % od[k] - pd[k];
      t /= od[k];
      if (c < 0 || c >= id[k]) {
        if (mode == 0) { inside = false; break; }
        if (mode == 1) c = c < 0 ? 0 : id[k] - 1;
        else {
          long long n = id[k] - 1;
          long long per = 2 * n;
          c = per ? ((c % per) + per) % per : 0;
          if (c > n) c = per - c;
        }
      }
      src += c * sd[k];
    }
    y[i] = inside ? x[src] : fromf(value);
  }
}
"""


class Pad(Op):
    """y = pad(x); attributes ``pads`` ((begin, end) per dim), ``mode``, ``value``."""

    name = "pad"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        check_positive(self.name, "x", x)
        r = len(x.shape)
        pads = tuple((int(a), int(b)) for a, b in attrs.get("pads", ()))
        mode = attrs.get("mode", "constant")
        if len(pads) != r or any(a < 0 or b < 0 for a, b in pads) or r > MAX_RANK:
            raise InvalidInput("pad: need (begin, end) >= 0 per dim", pads=pads, shape=x.shape)
        if mode not in MODES:
            raise InvalidInput("pad: unknown mode", mode=mode, supported=tuple(MODES))
        if mode == "reflect" and any(
            max(a, b) >= d for (a, b), d in zip(pads, x.shape, strict=True)
        ):
            raise InvalidInput("pad: reflect pads must be smaller than the dim", pads=pads)
        out = TensorSpec(tuple(d + a + b for d, (a, b) in zip(x.shape, pads, strict=True)), x.dtype)
        st, acc = [0] * r, 1
        for k in range(r - 1, -1, -1):
            st[k] = acc
            acc *= x.shape[k]
        dims = [(out.shape[k], x.shape[k], pads[k][0], st[k]) for k in range(r)][::-1]
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(("mode", mode), ("pads", pads), ("value", float(attrs.get("value", 0.0)))),
            detail=dims,
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        mode = plan.attr("mode")
        kw = {"constant_values": plan.attr("value")} if mode == "constant" else {}
        outputs[0][...] = np.pad(inputs[0], plan.attr("pads"), mode=mode, **kw)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, y = inputs[0], outputs[0]
        args: list[Any] = []
        for k in range(MAX_RANK):
            dims = plan.detail[k] if k < len(plan.detail) else (1, 1, 0, 0)
            args += [np.int64(d) for d in dims]
        kern = _cuda.kernel(SOURCE, "pad_nd", y.dtype)
        total = int(y.size)
        mode = np.int32(MODES[plan.attr("mode")])
        value = np.float32(plan.attr("value"))
        _cuda.launch(
            kern, total, (x, y, np.int64(total), np.int32(len(plan.detail)), mode, value, *args)
        )


PAD = Pad()
