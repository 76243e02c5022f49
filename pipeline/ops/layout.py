"""Moving data between layouts: transpose (with a dtype cast), concat and slice along an axis.

``transpose`` permutes up to 6 dimensions and may change the dtype on the way (an ONNX
model's float32 NCHW input becomes the compute dtype's NHWC in one pass). ``concat`` and
``slice`` copy blocks along one axis: the tensor is seen as [outer, axis, inner] and each
input is one strided block copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype

MAX_RANK = 6

SOURCE = r"""
// y[out index] = x[permuted index]; dims innermost first: (output size, input stride) x 6
extern "C" __global__ void transpose_f32_in(const float* __restrict__ x, T* __restrict__ y,
    long long total, int rank,
    long long d0, long long s0, long long d1, long long s1, long long d2, long long s2,
    long long d3, long long s3, long long d4, long long s4, long long d5, long long s5) {
  const long long dd[6] = {d0, d1, d2, d3, d4, d5};
  const long long ss[6] = {s0, s1, s2, s3, s4, s5};
  FERRY_FOR(i, total) {
    long long t = i, src = 0;
    for (int k = 0; k < rank; ++k) { src += (t % dd[k]) * ss[k]; t /= dd[k]; }
    y[i] = fromf(x[src]);
  }
}

extern "C" __global__ void transpose_same(const T* __restrict__ x, T* __restrict__ y,
    long long total, int rank,
    long long d0, long long s0, long long d1, long long s1, long long d2, long long s2,
    long long d3, long long s3, long long d4, long long s4, long long d5, long long s5) {
  const long long dd[6] = {d0, d1, d2, d3, d4, d5};
  const long long ss[6] = {s0, s1, s2, s3, s4, s5};
  FERRY_FOR(i, total) {
    long long t = i, src = 0;
    for (int k = 0; k < rank; ++k) { src += (t % dd[k]) * ss[k]; t /= dd[k]; }
    y[i] = x[src];
  }
}

// dst[o, dst_off + m, k] = src[o, src_off + m * step, k] for m < mid
extern "C" __global__ void copy_block(const T* __restrict__ src, T* __restrict__ dst,
    long long outer, long long mid, long long inner, long long src_mid, long long src_off,
    long long dst_mid, long long dst_off, long long step) {
  const long long total = outer * mid * inner;
  FERRY_FOR(i, total) {
    long long k = i % inner;
    long long t = i / inner;
    long long m = t % mid;
    long long o = t / mid;
    dst[(o * dst_mid + dst_off + m) * inner + k] =
        src[(o * src_mid + src_off + m * step) * inner + k];
  }
}
"""


def _strides(shape: tuple[int, ...]) -> list[int]:
    st, acc = [0] * len(shape), 1
    for k in range(len(shape) - 1, -1, -1):
        st[k] = acc
        acc *= shape[k]
    return st


class Transpose(Op):
    """y = x.transpose(perm), cast to ``dtype`` (default: x's). Inputs float16/float32."""

    name = "transpose"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        perm = tuple(int(p) for p in attrs.get("perm", ()))
        if sorted(perm) != list(range(len(x.shape))):
            raise InvalidInput("transpose: perm must permute the axes", perm=perm, shape=x.shape)
        if len(perm) > MAX_RANK:
            raise InvalidInput("transpose: too many dimensions", rank=len(perm), max=MAX_RANK)
        dtype = np.dtype(attrs.get("dtype", x.dtype)).name
        if dtype not in FLOAT_DTYPES:
            raise InvalidInput("transpose: dtype must be float", dtype=dtype)
        if dtype != x.dtype and x.dtype != "float32":
            raise InvalidInput("transpose: a cast must start from float32", x=x.dtype, dtype=dtype)
        out = TensorSpec(tuple(x.shape[p] for p in perm), dtype)
        st = _strides(x.shape)
        dims = [(out.shape[k], st[perm[k]]) for k in range(len(perm))][::-1]  # innermost first
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(("dtype", dtype), ("perm", perm)),
            detail=dims,
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        np.copyto(outputs[0], inputs[0].transpose(plan.attr("perm")), casting="unsafe")

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
            d, s = plan.detail[k] if k < len(plan.detail) else (1, 0)
            args += [np.int64(d), np.int64(s)]
        name = "transpose_same" if x.dtype == y.dtype else "transpose_f32_in"
        kern = _cuda.kernel(SOURCE, name, y.dtype)
        total = int(y.size)
        _cuda.launch(kern, total, (x, y, np.int64(total), np.int32(len(plan.detail)), *args))


def _axis_split(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    outer = int(np.prod(shape[:axis], dtype=np.int64)) if axis else 1
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64)) if axis + 1 < len(shape) else 1
    return outer, inner


def _copy_block_cuda(
    src: Any,
    dst: Any,
    outer: int,
    mid: int,
    inner: int,
    s_mid: int,
    s_off: int,
    d_mid: int,
    d_off: int,
    step: int = 1,
) -> None:
    kern = _cuda.kernel(SOURCE, "copy_block", dst.dtype)
    vals = (outer, mid, inner, s_mid, s_off, d_mid, d_off, step)
    _cuda.launch(kern, outer * mid * inner, (src, dst, *(np.int64(v) for v in vals)))


class Concat(Op):
    """Inputs of one rank and dtype, equal but along ``axis``, joined along ``axis``."""

    name = "concat"
    n_inputs = (1, 64)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        first = specs[0]
        check_dtype(self.name, "inputs", first, FLOAT_DTYPES)
        r = len(first.shape)
        axis = int(attrs.get("axis", -1))
        axis = axis + r if axis < 0 else axis
        if not 0 <= axis < r:
            raise InvalidInput("concat: axis out of range", axis=attrs.get("axis"), rank=r)
        for s in specs[1:]:
            same = (
                s.shape[:axis] + s.shape[axis + 1 :] == first.shape[:axis] + first.shape[axis + 1 :]
            )
            if s.dtype != first.dtype or len(s.shape) != r or not same:
                raise InvalidInput(
                    "concat: inputs differ off the axis", axis=axis, a=str(first), b=str(s)
                )
        total = sum(s.shape[axis] for s in specs)
        out = TensorSpec(first.shape[:axis] + (total,) + first.shape[axis + 1 :], first.dtype)
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            bytes_moved=2 * out.nbytes,
            attrs=(("axis", axis),),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        axis = plan.attr("axis")
        np.concatenate(list(inputs), axis=axis, out=outputs[0])

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        axis = plan.attr("axis")
        y = outputs[0]
        outer, inner = _axis_split(tuple(y.shape), axis)
        total = int(y.shape[axis])
        off = 0
        for x in inputs:
            mid = int(x.shape[axis])
            _copy_block_cuda(x, y, outer, mid, inner, mid, 0, total, off)
            off += mid


class Slice(Op):
    """y = x[..., start:stop:step, ...] along ``axis`` (``step`` >= 1, default 1)."""

    name = "slice"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        r = len(x.shape)
        axis = int(attrs.get("axis", -1))
        axis = axis + r if axis < 0 else axis
        start, stop = int(attrs.get("start", 0)), int(attrs.get("stop", -1))
        step = int(attrs.get("step", 1))
        if not 0 <= axis < r or not 0 <= start < stop <= x.shape[axis] or step < 1:
            raise InvalidInput(
                "slice: need 0 <= start < stop <= size on a valid axis, step >= 1",
                axis=axis,
                start=start,
                stop=stop,
                step=step,
                shape=x.shape,
            )
        size = -(-(stop - start) // step)
        out = TensorSpec(x.shape[:axis] + (size,) + x.shape[axis + 1 :], x.dtype)
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            bytes_moved=2 * out.nbytes,
            attrs=(("axis", axis), ("start", start), ("step", step), ("stop", stop)),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        axis = plan.attr("axis")
        idx = (slice(None),) * axis + (
            slice(plan.attr("start"), plan.attr("stop"), plan.attr("step")),
        )
        np.copyto(outputs[0], inputs[0][idx])

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, y = inputs[0], outputs[0]
        axis = plan.attr("axis")
        outer, inner = _axis_split(tuple(x.shape), axis)
        mid = int(y.shape[axis])
        src_mid, start = int(x.shape[axis]), plan.attr("start")
        _copy_block_cuda(x, y, outer, mid, inner, src_mid, start, mid, 0, plan.attr("step"))


TRANSPOSE = Transpose()
CONCAT = Concat()
SLICE = Slice()
