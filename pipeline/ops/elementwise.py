"""Fused elementwise ops: bias (+ residual) (+ ReLU), and add + ReLU.

Both are the activation epilogue (``activation.epilogue_cuda`` / ``epilogue_host``, the
pass conv2d and gemm end with): one pass over the output instead of three, 16-byte
vectors when the channel count allows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from .activation import epilogue_cuda, epilogue_host
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype


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
        epilogue_host(outputs[0], inputs[0], inputs[1], res, plan.attr("act", "relu"), 0.0, 0.0)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        res = inputs[2] if len(inputs) == 3 else None
        epilogue_cuda(outputs[0], inputs[0], inputs[1], res, plan.attr("act", "relu"), 0.0, 0.0)


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
        epilogue_cuda(outputs[0], inputs[0], None, inputs[1], "relu", 0.0, 0.0)


BIAS_ACT = BiasAct()
ADD_RELU = AddRelu()
