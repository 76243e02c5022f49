"""reshape: a view. In a graph its output shares the input's arena bytes, so it costs nothing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from .base import Op, OpPlan, TensorSpec


class Reshape(Op):
    name = "reshape"
    is_view = True

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        (x,) = specs
        shape = tuple(int(d) for d in attrs.get("shape", ()))
        if shape.count(-1) > 1 or any(d < -1 or d == 0 for d in shape):
            raise InvalidInput("reshape: bad target shape", shape=shape)
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64)) if shape else 1
        if -1 in shape:
            if x.size % known:
                raise InvalidInput("reshape: sizes do not divide", input=x.shape, shape=shape)
            shape = tuple(x.size // known if d == -1 else d for d in shape)
        if int(np.prod(shape, dtype=np.int64)) != x.size:
            raise InvalidInput("reshape: element counts differ", input=x.shape, shape=shape)
        return OpPlan(self.name, specs, (TensorSpec(shape, x.dtype),), 0, attrs=(("shape", shape),))

    def _copy(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        x, y = inputs[0], outputs[0]
        if _same_memory(x, y):
            return
        y[...] = x.reshape(y.shape)

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        self._copy(inputs, outputs)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        self._copy(inputs, outputs)


def _same_memory(x: Any, y: Any) -> bool:
    if hasattr(x, "data") and hasattr(x.data, "ptr"):
        return int(x.data.ptr) == int(y.data.ptr)
    return x.__array_interface__["data"][0] == y.__array_interface__["data"][0]


RESHAPE = Reshape()
