"""Activations, alone or as the epilogue of conv2d / gemm: y = act(x + bias[c] + residual).

The activations an imported model needs, each with up to two float parameters (a, b):

    none, relu, clip (min a, max b; ReLU6 is clip 0..6), sigmoid, hardsigmoid (max(0,
    min(1, a*x + b))), hardswish (x * relu6(x + 3) / 6), tanh, erf, gelu (exact, with erf),
    gelu_tanh (the tanh approximation), silu (x * sigmoid(x))

``epilogue_cuda`` / ``epilogue_host`` are the one fused pass (bias, residual, activation)
the conv and GEMM ops run after their product (``run_epilogue``) and ``bias_act`` /
``add_relu`` run as ops; ``Activation`` is the same pass alone (no bias, no residual).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype

ACTIVATIONS: dict[str, int] = {
    "none": 0,
    "relu": 1,
    "clip": 2,
    "sigmoid": 3,
    "hardsigmoid": 4,
    "hardswish": 5,
    "tanh": 6,
    "erf": 7,
    "gelu": 8,
    "gelu_tanh": 9,
    "silu": 10,
}

ACT_DEVICE = r"""
__device__ __forceinline__ float ferry_act(float v, int act, float a, float b) {
  switch (act) {
    case 1: return fmaxf(v, 0.f);
    case 2: return fminf(fmaxf(v, a), b);
    case 3: return 1.f / (1.f + __expf(-v));
    case 4: return fminf(fmaxf(a * v + b, 0.f), 1.f);
    case 5: return v * fminf(fmaxf(v + 3.f, 0.f), 6.f) * (1.f / 6.f);
    case 6: return tanhf(v);
    case 7: return erff(v);
    case 8: return 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    case 9: return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    case 10: return v / (1.f + __expf(-v));
    default: return v;
  }
}
"""

SOURCE = (
    ACT_DEVICE
    + r"""
extern "C" __global__ void epilogue_vec(T* __restrict__ y, const T* __restrict__ x,
    const float* __restrict__ bias, const T* __restrict__ res,
    long long nvec, int C, int has_bias, int has_res, int act, float a, float b) {
  typedef VecT<VEC> V;
  FERRY_FOR(i, nvec) {
    V u = reinterpret_cast<const V*>(x)[i];
    V r;
    if (has_res) r = reinterpret_cast<const V*>(res)[i];
    int c0 = (int)((i * VEC) % C);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      float v = tof(u.v[j]);
      if (has_bias) v += bias[c0 + j];
      if (has_res) v += tof(r.v[j]);
      u.v[j] = fromf(ferry_act(v, act, a, b));
    }
    reinterpret_cast<V*>(y)[i] = u;
  }
}

extern "C" __global__ void epilogue_scalar(T* __restrict__ y, const T* __restrict__ x,
    const float* __restrict__ bias, const T* __restrict__ res,
    long long n, int C, int has_bias, int has_res, int act, float a, float b) {
  FERRY_FOR(i, n) {
    float v = tof(x[i]);
    if (has_bias) v += bias[i % C];
    if (has_res) v += tof(res[i]);
    y[i] = fromf(ferry_act(v, act, a, b));
  }
}
"""
)


def check_act(op: str, attrs: dict[str, Any]) -> tuple[str, float, float]:
    """The (act, a, b) of an op's attributes, validated."""
    act = attrs.get("act", "none")
    if act not in ACTIVATIONS:
        raise InvalidInput(f"{op}: unknown activation", act=act, supported=tuple(ACTIVATIONS))
    a = float(attrs.get("alpha", 0.0))
    b = float(attrs.get("beta", 0.0))
    if act == "clip" and not a <= b:
        raise InvalidInput(f"{op}: clip needs min <= max", min=a, max=b)
    return act, a, b


def epilogue_cuda(
    y: Any, x: Any, bias: Any | None, residual: Any | None, act: str, a: float, b: float
) -> None:
    """y = act(x + bias[c] + residual) on cupy's current stream; y may be x."""
    C = int(x.shape[-1]) if x.ndim else 1
    n = int(x.size)
    vec = 16 // x.dtype.itemsize
    dummy_f = bias if bias is not None else y
    dummy_r = residual if residual is not None else x
    args = (
        np.int32(C),
        np.int32(bias is not None),
        np.int32(residual is not None),
        np.int32(ACTIVATIONS[act]),
        np.float32(a),
        np.float32(b),
    )
    if C % vec == 0 and n % vec == 0:
        k = _cuda.kernel(SOURCE, "epilogue_vec", x.dtype)
        _cuda.launch(k, n // vec, (y, x, dummy_f, dummy_r, np.int64(n // vec), *args))
    else:
        k = _cuda.kernel(SOURCE, "epilogue_scalar", x.dtype)
        _cuda.launch(k, n, (y, x, dummy_f, dummy_r, np.int64(n), *args))


def run_epilogue(plan: OpPlan, out: Any, bias: Any, residual: Any | None, cuda: bool) -> None:
    """out = act(out + bias + residual) in place, with the plan's ``act`` / ``alpha`` /
    ``beta``; nothing to do for ``none`` without a bias or a residual."""
    act = plan.attr("act", "none")
    if act == "none" and bias is None and residual is None:
        return
    a, b = plan.attr("alpha", 0.0), plan.attr("beta", 0.0)
    (epilogue_cuda if cuda else epilogue_host)(out, out, bias, residual, act, a, b)


def _erf(v: np.ndarray, out: np.ndarray) -> np.ndarray:
    """erf in numpy (no scipy on the embedded default): a Taylor series near 0, where it is
    accurate relative to the value, and Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7)
    elsewhere."""
    x = v.astype(np.float64)
    ax = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * ax)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    far = np.sign(x) * (1.0 - poly * np.exp(-ax * ax))
    x2 = x * x
    series = np.zeros_like(x)
    term = x.copy()
    for k in range(8):
        series += term / (2 * k + 1)
        term *= -x2 / (k + 1)
    series *= 2.0 / math.sqrt(math.pi)
    out[...] = np.where(ax < 0.5, series, far)
    return out


def apply_act_host(y: np.ndarray, act: str, a: float, b: float) -> None:
    """y = act(y) in place, in numpy."""
    if act == "none":
        return
    if act == "relu":
        np.maximum(y, 0, out=y)
    elif act == "clip":
        np.clip(y, a, b, out=y)
    elif act == "sigmoid":
        np.multiply(y, 0.5, out=y)
        np.tanh(y, out=y)
        np.add(y, 1, out=y)
        np.multiply(y, 0.5, out=y)
    elif act == "hardsigmoid":
        np.multiply(y, a, out=y)
        np.add(y, b, out=y)
        np.clip(y, 0, 1, out=y)
    elif act == "hardswish":
        y *= np.clip(y + 3, 0, 6) / 6
    elif act == "tanh":
        np.tanh(y, out=y)
    elif act == "erf":
        _erf(y, y)
    elif act == "gelu":
        y *= (1 + _erf(y * np.float32(1 / math.sqrt(2)), np.empty_like(y))) * 0.5
    elif act == "gelu_tanh":
        inner = np.tanh(np.float32(math.sqrt(2 / math.pi)) * (y + 0.044715 * y * y * y))
        y *= (1 + inner) * 0.5
    elif act == "silu":
        y *= 0.5 * (1 + np.tanh(0.5 * y))
    else:  # pragma: no cover - check_act refuses these
        raise InvalidInput("unknown activation", act=act)


def epilogue_host(
    y: np.ndarray,
    x: np.ndarray,
    bias: np.ndarray | None,
    residual: np.ndarray | None,
    act: str,
    a: float,
    b: float,
) -> None:
    if y is not x:
        np.copyto(y, x)
    if bias is not None:
        np.add(y, bias.astype(y.dtype, copy=False), out=y)
    if residual is not None:
        np.add(y, residual, out=y)
    apply_act_host(y, act, a, b)


class Activation(Op):
    """y = act(x) for any shape; attributes ``act``, ``alpha``, ``beta``."""

    name = "activation"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        act, a, b = check_act(self.name, attrs)
        return OpPlan(
            self.name,
            specs,
            (x,),
            0,
            flops=x.size * 4,
            bytes_moved=2 * x.nbytes,
            attrs=(("act", act), ("alpha", a), ("beta", b)),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        epilogue_host(
            outputs[0],
            inputs[0],
            None,
            None,
            plan.attr("act"),
            plan.attr("alpha"),
            plan.attr("beta"),
        )

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        epilogue_cuda(
            outputs[0],
            inputs[0],
            None,
            None,
            plan.attr("act"),
            plan.attr("alpha"),
            plan.attr("beta"),
        )


ACTIVATION = Activation()
