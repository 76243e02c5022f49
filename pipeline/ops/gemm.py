"""GEMM through cuBLAS (``cublasGemmEx``, fp32 accumulation), with the fused epilogue (bias, activation).

A is [M, K], B is [K, N] (weights are stored pre-transposed at load time), both row-major;
an optional float32 bias [N]; ``act`` is relu / none or any activation of ``activation.py``.
On the CPU, ``numpy.matmul`` into the output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import InvalidInput
from . import _cuda
from .activation import check_act, run_epilogue
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype, check_positive, check_rank


class Gemm(Op):
    name = "gemm"
    n_inputs = (2, 3)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        a, b = specs[0], specs[1]
        for what, s in (("A", a), ("B", b)):
            check_rank(self.name, what, s, 2)
            check_dtype(self.name, what, s, FLOAT_DTYPES)
            check_positive(self.name, what, s)
        if a.dtype != b.dtype:
            raise InvalidInput("gemm: A and B must share a dtype", a=a.dtype, b=b.dtype)
        m, k = a.shape
        k2, n = b.shape
        if k != k2:
            raise InvalidInput("gemm: inner dimensions differ", a=a.shape, b=b.shape)
        if len(specs) == 3:
            bias = specs[2]
            check_dtype(self.name, "bias", bias, ("float32",))
            if bias.shape != (n,):
                raise InvalidInput("gemm: bias must be [N]", bias=bias.shape, n=n)
        check_act(self.name, attrs)  # relu / none, or any activation of activation.py
        out = TensorSpec((m, n), a.dtype)
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=2 * m * n * k,
            bytes_moved=a.nbytes + b.nbytes + out.nbytes,
            attrs=tuple(sorted(attrs.items())),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        out = outputs[0]
        np.matmul(inputs[0], inputs[1], out=out)
        run_epilogue(plan, out, inputs[2] if len(inputs) == 3 else None, None, cuda=False)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        a, b, out = inputs[0], inputs[1], outputs[0]
        m, k = plan.inputs[0].shape
        n = plan.inputs[1].shape[1]
        _cuda.gemm_rowmajor(stream, _cuda.ptr(a), _cuda.ptr(b), _cuda.ptr(out), m, n, k, a.dtype)
        run_epilogue(plan, out, inputs[2] if len(inputs) == 3 else None, None, cuda=True)


GEMM = Gemm()
