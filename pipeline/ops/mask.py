"""Class masks: ``ArgmaxMask`` (per-pixel class scores -> one byte a pixel) and
``ResizeNearest`` (a mask's window resized to another size, nearest neighbour: a class is
never blended with its neighbour).

One code path for both backends (``xp`` is numpy or cupy), writing into the outputs and the
workspace only. ``ResizeNearest`` reads its row and column indices from a table, as
``resize_crop`` reads its geometry: ``table(plan)`` gives the bytes, which the caller puts at
the start of the workspace before ``commit`` on the GPU (the host path reads the plan's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, XpOp, align, check_tensor, workspace_view

MAX_CLASSES = 256


class ArgmaxMask(XpOp):
    """``x`` scores [N, C, H, W] (``layout="nchw"``) or [N, H, W, C] -> uint8 [N, H, W], the
    highest-scoring class of each pixel (the first one on a tie)."""

    name = "argmax_mask"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 4, FLOAT_DTYPES)
        layout = attrs.get("layout", "nchw")
        if layout not in ("nchw", "nhwc"):
            raise InvalidInput("argmax_mask: layout must be 'nchw' or 'nhwc'", layout=layout)
        n, c, h, w = x.shape if layout == "nchw" else (x.shape[0], x.shape[3], *x.shape[1:3])
        if c > MAX_CLASSES:
            raise InvalidInput("argmax_mask: a byte holds 256 classes", classes=c)
        out = TensorSpec((n, h, w), "uint8")
        idx = TensorSpec((n, h, w), "int64")
        return OpPlan(
            self.name,
            specs,
            (out,),
            idx.nbytes,
            flops=x.size,
            bytes_moved=x.nbytes + out.nbytes,
            attrs=(("layout", layout),),
            detail=(1 if layout == "nchw" else 3, idx),
        )

    def run_xp(
        self, xp: Any, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        argmax_mask(xp, plan, inputs[0], outputs[0], workspace)


def argmax_mask(xp: Any, plan: OpPlan, x: Any, y: Any, workspace: Any) -> None:
    axis, idx_spec = plan.detail
    idx = workspace_view(workspace, 0, idx_spec.shape, idx_spec.dtype)
    xp.argmax(x, axis=axis, out=idx)
    xp.copyto(y, idx, casting="unsafe")


def nearest_indices(size: int, start: int, count: int, out: int) -> np.ndarray:
    """Source indices of ``out`` nearest-neighbour samples over ``start .. start + count``."""
    i = np.arange(out, dtype=np.float64)
    return start + np.minimum(np.floor((i + 0.5) * count / out), count - 1).astype(np.int64)


class ResizeNearest(Op):
    """``x`` uint8 [H, W] -> uint8 [height, width]: the ``window`` (top, left, h, w) of
    ``x`` (all of it by default) resized, nearest neighbour."""

    name = "resize_nearest"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_tensor(self.name, "x", x, 2, ("uint8",))
        h_in, w_in = x.shape
        try:
            oh, ow = int(attrs["height"]), int(attrs["width"])
        except (KeyError, TypeError, ValueError):
            raise InvalidInput(
                "resize_nearest: needs height and width", attrs=sorted(attrs)
            ) from None
        top, left, wh, ww = (int(v) for v in attrs.get("window", (0, 0, h_in, w_in)))
        if not (top >= 0 and left >= 0 and wh > 0 and ww > 0):
            raise InvalidInput("resize_nearest: bad window", window=(top, left, wh, ww))
        if top + wh > h_in or left + ww > w_in or not (0 < oh <= 1 << 16 and 0 < ow <= 1 << 16):
            raise InvalidInput(
                "resize_nearest: window or size out of range",
                window=(top, left, wh, ww),
                size=(oh, ow),
                input=(h_in, w_in),
            )
        rows = nearest_indices(h_in, top, wh, oh)
        cols = nearest_indices(w_in, left, ww, ow)
        o_cols = align(rows.nbytes)
        o_tmp = o_cols + align(cols.nbytes)
        out = TensorSpec((oh, ow), "uint8")
        return OpPlan(
            self.name,
            specs,
            (out,),
            o_tmp + oh * w_in,
            bytes_moved=out.nbytes * 2,
            attrs=(("height", oh), ("width", ow), ("window", (top, left, wh, ww))),
            detail=(rows, cols, o_cols, o_tmp),
        )

    def table(self, plan: OpPlan) -> np.ndarray:
        """The workspace's first bytes (host): the row and column indices."""
        rows, cols, o_cols, _ = plan.detail
        out = np.zeros(o_cols + cols.nbytes, np.uint8)
        out[: rows.nbytes] = rows.view(np.uint8)
        out[o_cols:] = cols.view(np.uint8)
        return out

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        rows, cols, _, o_tmp = plan.detail
        tmp = workspace_view(workspace, o_tmp, (len(rows), inputs[0].shape[1]), np.uint8)
        resize_nearest(np, inputs[0], outputs[0], rows, cols, tmp)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        import cupy  # optional: cupy

        rows, cols, o_cols, o_tmp = plan.detail
        r = workspace_view(workspace, 0, rows.shape, np.int64)  # uploaded by the caller
        c = workspace_view(workspace, o_cols, cols.shape, np.int64)
        tmp = workspace_view(workspace, o_tmp, (len(rows), inputs[0].shape[1]), np.uint8)
        resize_nearest(cupy, inputs[0], outputs[0], r, c, tmp)


def resize_nearest(xp: Any, x: Any, y: Any, rows: Any, cols: Any, tmp: Any) -> None:
    """Rows gathered into ``tmp``, then columns into ``y``."""
    xp.take(x, rows, axis=0, out=tmp)
    xp.take(tmp, cols, axis=1, out=y)


ARGMAX_MASK = ArgmaxMask()
RESIZE_NEAREST = ResizeNearest()
