"""AllFinite: whether each row of a batch holds only finite numbers, ``x`` [N, ...] float ->
uint8 [N] (1: all finite).

A task's epilogue runs it beside the op that turns the model's float output into bytes, so
that a row of NaN or infinity (fp16 overflow) is still answered ``NonFiniteOutput`` and
never becomes pixels. One code path for both backends, into the workspace (a bool a value)
and the output only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import InvalidInput
from .base import FLOAT_DTYPES, OpPlan, TensorSpec, XpOp, check_dtype, workspace_view


class AllFinite(XpOp):
    name = "all_finite"

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        check_dtype(self.name, "x", x, FLOAT_DTYPES)
        if len(x.shape) < 1 or x.shape[0] < 1:
            raise InvalidInput("all_finite: x needs a batch dimension", shape=x.shape)
        n = x.shape[0]
        flags = TensorSpec((n, x.size // n), "bool")
        return OpPlan(
            self.name,
            specs,
            (TensorSpec((n,), "uint8"),),
            flags.nbytes + n,
            flops=x.size,
            bytes_moved=x.nbytes + n,
            detail=flags,
        )

    def run_xp(
        self, xp: Any, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        all_finite(xp, plan, inputs[0], outputs[0], workspace)


def all_finite(xp: Any, plan: OpPlan, x: Any, y: Any, workspace: Any) -> None:
    flags_spec: TensorSpec = plan.detail
    n = flags_spec.shape[0]
    flags = workspace_view(workspace, 0, flags_spec.shape, "bool")
    rows = workspace_view(workspace, flags_spec.nbytes, (n,), "bool")
    xp.isfinite(x.reshape(flags_spec.shape), out=flags)
    xp.all(flags, axis=1, out=rows)
    xp.copyto(y, rows, casting="unsafe")


ALL_FINITE = AllFinite()
