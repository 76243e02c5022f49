"""Fused elementwise kernels: bias (+ residual) (+ ReLU), and add + ReLU.

``bias_act`` is also the epilogue of conv2d and gemm: one pass over the output instead of
three (bias, residual add, activation). 16-byte vectors when the channel count allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype

SOURCE = r"""
extern "C" __global__ void bias_act_vec(T* __restrict__ y, const T* __restrict__ x,
    const float* __restrict__ bias, const T* __restrict__ res,
    long long nvec, int C, int has_bias, int has_res, int relu) {
  typedef VecT<VEC> V;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nvec;
       i += (long long)gridDim.x * blockDim.x) {
    V a = reinterpret_cast<const V*>(x)[i];
    V r;
    if (has_res) r = reinterpret_cast<const V*>(res)[i];
    int c0 = (int)((i * VEC) % C);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float v = tof(a.v[j]);
      if (has_bias) v += bias[c0 + j];
      if (has_res) v += tof(r.v[j]);
      if (relu) v = fmaxf(v, 0.f);
      a.v[j] = fromf(v);
    }
    reinterpret_cast<V*>(y)[i] = a;
  }
}

extern "C" __global__ void bias_act_scalar(T* __restrict__ y, const T* __restrict__ x,
    const float* __restrict__ bias, const T* __restrict__ res,
    long long n, int C, int has_bias, int has_res, int relu) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    float v = tof(x[i]);
    if (has_bias) v += bias[i % C];
    if (has_res) v += tof(res[i]);
    if (relu) v = fmaxf(v, 0.f);
    y[i] = fromf(v);
  }
}
"""


def bias_act_cuda(y: Any, x: Any, bias: Any | None, residual: Any | None, relu: bool) -> None:
    """y = act(x + bias[c] + residual) on cupy's current stream; y may be x."""
    C = int(x.shape[-1])
    n = int(x.size)
    vec = 16 // x.dtype.itemsize
    dummy_f = bias if bias is not None else y
    dummy_r = residual if residual is not None else x
    flags = (np.int32(bias is not None), np.int32(residual is not None), np.int32(bool(relu)))
    if C % vec == 0:
        k = _cuda.kernel(SOURCE, "bias_act_vec", x.dtype)
        nvec = n // vec
        _cuda.launch(k, nvec, (y, x, dummy_f, dummy_r, np.int64(nvec), np.int32(C), *flags))
    else:
        k = _cuda.kernel(SOURCE, "bias_act_scalar", x.dtype)
        _cuda.launch(k, n, (y, x, dummy_f, dummy_r, np.int64(n), np.int32(C), *flags))


def bias_act_host(
    y: np.ndarray, x: np.ndarray, bias: np.ndarray | None, residual: np.ndarray | None, relu: bool
) -> None:
    if y is not x:
        np.copyto(y, x)
    if bias is not None:
        np.add(y, bias.astype(y.dtype, copy=False), out=y)
    if residual is not None:
        np.add(y, residual, out=y)
    if relu:
        np.maximum(y, 0, out=y)


class BiasAct(Op):
    """y = act(x + bias) (+ residual); x is [..., C], bias float32 [C], residual like x."""

    name = "bias_act"
    n_inputs = (2, 3)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        x, b = specs[0], specs[1]
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        check_dtype(self.name, "bias", b, ("float32",))
        act = attrs.get("act", "relu")
        if act not in ("relu", "none"):
            raise InvalidInput("bias_act: act must be 'relu' or 'none'", act=act)
        if len(x.shape) < 1 or b.shape != (x.shape[-1],):
            raise InvalidInput("bias_act: bias must be [C] for x [..., C]", x=x.shape, bias=b.shape)
        if len(specs) == 3 and specs[2] != x:
            raise InvalidInput("bias_act: residual must match x", x=str(x), residual=str(specs[2]))
        n_read = x.nbytes * (2 if len(specs) == 3 else 1)
        return OpPlan(
            self.name,
            specs,
            (x,),
            0,
            flops=x.size * 3,
            bytes_moved=n_read + x.nbytes + b.nbytes,
            attrs=tuple(sorted(attrs.items())),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        res = inputs[2] if len(inputs) == 3 else None
        bias_act_host(outputs[0], inputs[0], inputs[1], res, plan.attr("act", "relu") == "relu")

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        res = inputs[2] if len(inputs) == 3 else None
        bias_act_cuda(outputs[0], inputs[0], inputs[1], res, plan.attr("act", "relu") == "relu")


class AddRelu(Op):
    """y = relu(a + b) for two tensors of one spec."""

    name = "add_relu"
    n_inputs = (2, 2)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        a, b = specs
        check_dtype(self.name, "a", a, FLOAT_DTYPES)
        if a != b:
            raise InvalidInput("add_relu: inputs must have one shape and dtype", a=str(a), b=str(b))
        return OpPlan(self.name, specs, (a,), 0, flops=a.size * 2, bytes_moved=3 * a.nbytes)

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        np.add(inputs[0], inputs[1], out=outputs[0])
        np.maximum(outputs[0], 0, out=outputs[0])

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        bias_act_cuda(outputs[0], inputs[0], None, inputs[1], True)


BIAS_ACT = BiasAct()
ADD_RELU = AddRelu()
