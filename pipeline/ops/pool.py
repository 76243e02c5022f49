"""Pooling in NHWC: the square max pool (k x k, stride, padding: ``pool2d``'s max) and the
global average pool -> [N, C]."""

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
from .pool2d import Pool2d

SOURCE = r"""
extern "C" __global__ void gap_nhwc(const T* __restrict__ x, T* __restrict__ y,
    long long total, int HW, int C) {
  FERRY_FOR(i, total) {
    int c = (int)(i % C);
    long long n = i / C;
    const T* p = x + n * (long long)HW * C + c;
    float s = 0.f;
    for (int j = 0; j < HW; ++j) s += tof(p[(long long)j * C]);
    y[i] = fromf(s / HW);
  }
}
"""


class MaxPool2d(Pool2d):
    """The square max pool (kernel, stride, symmetric padding) the native ResNet-50 and the
    ONNX importer use: ``pool2d``'s max with its attributes, planned and run by it."""

    name = "maxpool2d"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        k = int(attrs.get("kernel", 3))
        s = int(attrs.get("stride", 2))
        p = int(attrs.get("padding", 1))
        if k < 1 or s < 1 or p < 0 or p > k // 2:
            raise InvalidInput(
                "maxpool2d: need kernel >= 1, stride >= 1, 0 <= padding <= kernel // 2",
                kernel=k,
                stride=s,
                padding=p,
            )
        pool = {"kind": "max", "kernel": (k, k), "stride": (s, s), "pads": (p, p, p, p)}
        return super()._plan(specs, pool)


class GlobalAvgPool(Op):
    name = "global_avg_pool"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 4, FLOAT_DTYPES)
        n, h, w, c = x.shape
        out = TensorSpec((n, c), x.dtype)
        return OpPlan(self.name, specs, (out,), 0, flops=x.size, bytes_moved=x.nbytes + out.nbytes)

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        outputs[0][...] = np.mean(inputs[0], axis=(1, 2), dtype=np.float32)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        x, y = inputs[0], outputs[0]
        n, h, w, c = x.shape
        kern = _cuda.kernel(SOURCE, "gap_nhwc", x.dtype)
        total = n * c
        _cuda.launch(kern, total, (x, y, np.int64(total), np.int32(h * w), np.int32(c)))


MAXPOOL2D = MaxPool2d()
GLOBAL_AVG_POOL = GlobalAvgPool()
