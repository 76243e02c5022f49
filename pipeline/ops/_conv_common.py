"""What conv2d and conv2d_grouped share: attribute pairs, the input checks, the residual's,
and how many im2col rows fit the workspace. (Their epilogue is ``activation.run_epilogue``.)"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidInput
from .base import FLOAT_DTYPES, TensorSpec, check_dtype, check_tensor

DEFAULT_MAX_WORKSPACE = 256 << 20


def pair(op: str, v: Any, what: str) -> tuple[int, int]:
    """An int or a pair of ints as a pair."""
    if isinstance(v, int | np.integer):
        return int(v), int(v)
    t = tuple(int(e) for e in v)
    if len(t) != 2:
        raise InvalidInput(f"{op}: {what} must be an int or a pair", value=v)
    return t  # type: ignore[return-value]


def check_inputs(
    op: str, specs: tuple[TensorSpec, ...]
) -> tuple[TensorSpec, TensorSpec, TensorSpec]:
    """x [N, H, W, C] float, weights of x's dtype, bias float32."""
    x, w, b = specs[0], specs[1], specs[2]
    check_tensor(op, "x", x, 4, FLOAT_DTYPES)
    if w.dtype != x.dtype:
        raise InvalidInput(f"{op}: weights must have the input's dtype", x=x.dtype, w=w.dtype)
    check_dtype(op, "bias", b, ("float32",))
    return x, w, b


def check_residual(op: str, specs: tuple[TensorSpec, ...], out: TensorSpec) -> None:
    if len(specs) == 4 and specs[3] != out:
        raise InvalidInput(
            f"{op}: residual must match the output", residual=str(specs[3]), output=str(out)
        )


def cuda_rows(m: int, k: int, item: int, max_ws: int) -> int:
    """Rows of the im2col matrix ([rows, k] of ``item`` bytes) done at once within
    ``max_ws``: all of them, or a multiple of 64."""
    rows = max(1, min(m, max_ws // (k * item)))
    return max(64, rows // 64 * 64) if rows < m else rows
