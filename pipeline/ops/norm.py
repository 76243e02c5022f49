"""Normalisation over the last axis: layer norm, and a per-channel affine (a batch norm that
could not be folded into a conv) with an activation after.

``layer_norm``: y = (x - mean) / sqrt(var + eps) * gamma + beta over the last axis (C);
gamma and beta float32 [C]. One warp per row on the GPU, statistics in float.
``channel_affine``: y = act(x * scale[c] + shift[c]); scale and shift float32 [C].
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .activation import ACT_DEVICE, ACTIVATIONS, apply_act_host, check_act
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype, check_positive

SOURCE = (
    ACT_DEVICE
    + r"""
__device__ __forceinline__ float warp_sum_f(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

// one warp per row; blockDim.x == 256 (8 rows a block)
extern "C" __global__ void layer_norm_rows(const T* __restrict__ x, const float* __restrict__ g,
    const float* __restrict__ b, T* __restrict__ y, long long rows, int C, float eps) {
  long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const T* xr = x + row * C;
  T* yr = y + row * C;
  float s = 0.f;
  for (int i = lane; i < C; i += 32) s += tof(xr[i]);
  float mean = warp_sum_f(s) / C;
  float q = 0.f;
  for (int i = lane; i < C; i += 32) { float d = tof(xr[i]) - mean; q += d * d; }
  float inv = rsqrtf(warp_sum_f(q) / C + eps);
  for (int i = lane; i < C; i += 32) yr[i] = fromf((tof(xr[i]) - mean) * inv * g[i] + b[i]);
}

extern "C" __global__ void channel_affine(const T* __restrict__ x, const float* __restrict__ s,
    const float* __restrict__ t, T* __restrict__ y, long long n, int C, int act, float a, float b) {
  FERRY_FOR(i, n) {
    int c = (int)(i % C);
    y[i] = fromf(ferry_act(tof(x[i]) * s[c] + t[c], act, a, b));
  }
}
"""
)


def _check_vec(op: str, what: str, spec: TensorSpec, c: int) -> None:
    check_dtype(op, what, spec, ("float32",))
    if spec.shape != (c,):
        raise InvalidInput(f"{op}: {what} must be [C]", shape=spec.shape, c=c)


class LayerNorm(Op):
    name = "layer_norm"
    n_inputs = (3, 3)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        x, g, b = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        check_positive(self.name, "x", x)
        if not x.shape:
            raise InvalidInput("layer_norm: x needs a last axis", shape=x.shape)
        c = x.shape[-1]
        _check_vec(self.name, "gamma", g, c)
        _check_vec(self.name, "beta", b, c)
        eps = float(attrs.get("eps", 1e-5))
        if not eps > 0:
            raise InvalidInput("layer_norm: eps must be > 0", eps=eps)
        return OpPlan(
            self.name,
            specs,
            (x,),
            0,
            flops=x.size * 8,
            bytes_moved=3 * x.nbytes,
            attrs=(("eps", eps),),
            detail=(x.size // c, c),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        x, g, b = inputs
        y = outputs[0]
        mean = np.mean(x, axis=-1, keepdims=True, dtype=np.float32)
        np.subtract(x, mean, out=y)
        var = np.mean(np.square(y), axis=-1, keepdims=True)
        y /= np.sqrt(var + np.float32(plan.attr("eps")))
        y *= g.astype(y.dtype, copy=False)
        y += b.astype(y.dtype, copy=False)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        rows, c = plan.detail
        kern = _cuda.kernel(SOURCE, "layer_norm_rows", inputs[0].dtype)
        kern(
            ((rows + 7) // 8,),
            (256,),
            (*inputs, outputs[0], np.int64(rows), np.int32(c), np.float32(plan.attr("eps"))),
        )


class ChannelAffine(Op):
    name = "channel_affine"
    n_inputs = (3, 3)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        x, s, t = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        if not x.shape:
            raise InvalidInput("channel_affine: x needs a last axis", shape=x.shape)
        _check_vec(self.name, "scale", s, x.shape[-1])
        _check_vec(self.name, "shift", t, x.shape[-1])
        act, a, b = check_act(self.name, attrs)
        return OpPlan(
            self.name,
            specs,
            (x,),
            0,
            flops=x.size * 3,
            bytes_moved=2 * x.nbytes,
            attrs=(("act", act), ("alpha", a), ("beta", b)),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        x, s, t = inputs
        y = outputs[0]
        np.multiply(x, s.astype(y.dtype, copy=False), out=y)
        np.add(y, t.astype(y.dtype, copy=False), out=y)
        apply_act_host(y, plan.attr("act"), plan.attr("alpha"), plan.attr("beta"))

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, s, t = inputs
        y = outputs[0]
        kern = _cuda.kernel(SOURCE, "channel_affine", x.dtype)
        n = int(x.size)
        _cuda.launch(
            kern,
            n,
            (
                x,
                s,
                t,
                y,
                np.int64(n),
                np.int32(x.shape[-1]),
                np.int32(ACTIVATIONS[plan.attr("act")]),
                np.float32(plan.attr("alpha")),
                np.float32(plan.attr("beta")),
            ),
        )


LAYER_NORM = LayerNorm()
CHANNEL_AFFINE = ChannelAffine()
