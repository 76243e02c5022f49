"""Normalization of uint8 images: ``(x / 255 - mean) / std`` per channel, NHWC or NCHW.

Mean and std are on the [0, 1] scale, as torchvision gives them; NHWC output can be padded
with zero channels. The resize is ``resize_crop`` (one implementation, next door).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .base import Op, OpPlan, TensorSpec, check_tensor

SOURCE = r"""
// per-channel scale s and shift t come by value (at most 4 channels): no table, no copy
extern "C" __global__ void normalize_u8(const unsigned char* __restrict__ x, T* __restrict__ y,
    float s0, float s1, float s2, float s3, float t0, float t1, float t2, float t3,
    long long total, int HW, int C, int Cp, int nchw) {
  const float s[4] = {s0, s1, s2, s3};
  const float t[4] = {t0, t1, t2, t3};
  FERRY_FOR(i, total) {
    int c; long long p;  // output channel, pixel index n*HW + hw
    if (nchw) { long long q = i / HW; c = (int)(q % Cp); p = (q / Cp) * HW + i % HW; }
    else { c = (int)(i % Cp); p = i / Cp; }
    float v = 0.f;
    if (c < C) v = (float)x[p * C + c] * s[c] + t[c];
    y[i] = fromf(v);
  }
}
"""


def _floats(v: Any, n: int, what: str) -> tuple[float, ...]:
    t = tuple(float(e) for e in (v if isinstance(v, list | tuple) else [v] * n))
    if len(t) != n:
        raise InvalidInput(f"normalize: {what} needs one value per channel", values=t, channels=n)
    return t


class Normalize(Op):
    name = "normalize"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 4, ("uint8",))
        n, h, w, c = x.shape
        if c > 4:
            raise InvalidInput("normalize: images have 1 to 4 channels", channels=c)
        mean = _floats(attrs.get("mean", 0.0), c, "mean")
        std = _floats(attrs.get("std", 1.0), c, "std")
        if any(s <= 0 for s in std):
            raise InvalidInput("normalize: std must be positive", std=std)
        layout = attrs.get("layout", "nhwc")
        if layout not in ("nhwc", "nchw"):
            raise InvalidInput("normalize: layout must be 'nhwc' or 'nchw'", layout=layout)
        dtype = attrs.get("dtype", "float32")
        if dtype not in ("float16", "float32"):
            raise InvalidInput("normalize: dtype must be float16 or float32", dtype=dtype)
        cp = int(attrs.get("pad_channels", c))
        if cp < c:
            raise InvalidInput(
                "normalize: pad_channels must be >= the input's channels",
                pad_channels=cp,
                channels=c,
            )
        shape = (n, h, w, cp) if layout == "nhwc" else (n, cp, h, w)
        out = TensorSpec(shape, dtype)
        scale = np.array([1.0 / (255.0 * s) for s in std] + [0.0] * (cp - c), dtype=np.float32)
        shift = np.array(
            [-m / s for m, s in zip(mean, std, strict=True)] + [0.0] * (cp - c), dtype=np.float32
        )
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=2 * out.size,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(
                ("dtype", dtype),
                ("layout", layout),
                ("mean", mean),
                ("pad_channels", cp),
                ("std", std),
            ),
            detail=(scale, shift, layout),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        scale, shift, layout = plan.detail
        x, y = inputs[0], outputs[0]
        c = x.shape[3]
        v = x.astype(np.float32) * scale[:c] + shift[:c]
        if layout == "nhwc":
            y[..., :c] = v
            y[..., c:] = 0
        else:
            y[:, :c] = v.transpose(0, 3, 1, 2)
            y[:, c:] = 0

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        scale, shift, layout = plan.detail
        x, y = inputs[0], outputs[0]
        n, h, w, c = x.shape
        cp = len(scale)
        affine = np.zeros(8, dtype=np.float32)
        affine[:c], affine[4 : 4 + c] = scale[:c], shift[:c]
        kern = _cuda.kernel(SOURCE, "normalize_u8", y.dtype)
        total = int(y.size)
        _cuda.launch(
            kern,
            total,
            (
                x,
                y,
                *(np.float32(v) for v in affine),
                np.int64(total),
                np.int32(h * w),
                np.int32(c),
                np.int32(cp),
                np.int32(layout == "nchw"),
            ),
        )


NORMALIZE = Normalize()
