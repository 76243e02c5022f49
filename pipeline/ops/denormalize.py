"""Denormalize: a model's float image output back to uint8 pixels, per channel
``clip(rint(x * scale + shift), 0, 255)``, NCHW or NHWC in, NHWC out.

``scale`` and ``shift`` are what undoes the input's normalisation (``std * 255``,
``mean * 255``; ``pipeline.tasks.spec``), or a fixed range. One code path for both backends
(``xp`` is numpy or cupy): every step writes into the output or the workspace (``out=``),
with the per-channel constants as scalars, so ``commit`` allocates nothing on either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from .base import FLOAT_DTYPES, OpPlan, TensorSpec, XpOp, check_tensor, workspace_view


class Denormalize(XpOp):
    """``x`` float [N, C, H, W] (``layout="nchw"``) or [N, H, W, C] -> uint8 [N, H, W, C]."""

    name = "denormalize"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 4, FLOAT_DTYPES)
        layout = attrs.get("layout", "nchw")
        if layout not in ("nchw", "nhwc"):
            raise InvalidInput("denormalize: layout must be 'nchw' or 'nhwc'", layout=layout)
        n, c, h, w = x.shape if layout == "nchw" else (x.shape[0], x.shape[3], *x.shape[1:3])
        scale = tuple(float(v) for v in attrs.get("scale", (255.0,) * c))
        shift = tuple(float(v) for v in attrs.get("shift", (0.0,) * c))
        if len(scale) != c or len(shift) != c:
            raise InvalidInput(
                "denormalize: one scale and one shift per channel",
                channels=c,
                scale=scale,
                shift=shift,
            )
        out = TensorSpec((n, h, w, c), "uint8")
        tmp = TensorSpec((n, h, w, c), "float32")
        return OpPlan(
            self.name,
            specs,
            (out,),
            tmp.nbytes,
            flops=4 * out.size,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(("layout", layout), ("scale", scale), ("shift", shift)),
            detail=(layout, scale, shift, tmp),
        )

    def run_xp(
        self, xp: Any, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        denormalize(xp, plan, inputs[0], outputs[0], workspace)


def denormalize(xp: Any, plan: OpPlan, x: Any, y: Any, workspace: Any) -> None:
    """The op on ``xp`` (numpy or cupy): each channel scaled and shifted into the float32
    workspace, rounded and clipped there, cast into ``y``."""
    layout, scale, shift, tmp_spec = plan.detail
    tmp = workspace_view(workspace, 0, tmp_spec.shape, tmp_spec.dtype)
    for c, (a, b) in enumerate(zip(scale, shift, strict=True)):
        src = x[:, c] if layout == "nchw" else x[..., c]
        dst = tmp[..., c]
        xp.multiply(src, np.float32(a), out=dst)
        xp.add(dst, np.float32(b), out=dst)
    xp.rint(tmp, out=tmp)
    xp.clip(tmp, 0, 255, out=tmp)
    xp.copyto(y, tmp, casting="unsafe")


DENORMALIZE = Denormalize()
