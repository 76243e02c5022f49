"""MatMul of two activations (attention's q @ k^T and p @ v): [..., M, K] x [..., K, N].

The leading dimensions broadcast as numpy's do where one side's are all 1 or both are
equal; they are flattened to one batch count at plan time. On the GPU one
``cublasGemmStridedBatchedEx`` call (fp32 accumulation; a stride of 0 repeats the
broadcast side), on the CPU ``numpy.matmul`` into the output.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DeviceError, InvalidInput
from . import _cuda
from .base import FLOAT_DTYPES, Op, OpPlan, TensorSpec, check_dtype, check_positive

_batched: Any = None


def _cublas_batched() -> Any:
    """``cublasGemmStridedBatchedEx`` through ctypes, as ``_cuda`` binds ``cublasGemmEx``."""
    global _batched
    if _batched is None:
        from cupy_backends.cuda.libs import cublas  # noqa: F401  (maps libcublas; cupy)

        path = _cuda._loaded_library("libcublas.so") or ctypes.util.find_library("cublas")
        if path is None:
            raise DeviceError("libcublas is not loaded and cannot be found")
        f = ctypes.CDLL(path).cublasGemmStridedBatchedEx
        f.restype = ctypes.c_int
        vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
        f.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll, i, i, i]
        _batched = f
    return _batched


def gemm_batched_rowmajor(
    stream: Any, a: int, b: int, c: int, m: int, n: int, k: int, count: int,
    stride_a: int, stride_b: int, dtype: Any,
) -> None:  # fmt: skip
    """C[i] = A[i] @ B[i] for i < count, row-major, as ``_cuda.gemm_rowmajor`` (C^T = B^T A^T)."""
    dt = _cuda._CUDA_DT[np.dtype(dtype).name]
    status = _cublas_batched()(
        stream.cublas_handle, 0, 0, int(n), int(m), int(k), _cuda._ONE.ctypes.data,
        int(b), dt, int(n), int(stride_b), int(a), dt, int(k), int(stride_a),
        _cuda._ZERO.ctypes.data, int(c), dt, int(n), int(m * n), int(count),
        _cuda._CUBLAS_COMPUTE_32F, _cuda._CUBLAS_GEMM_DEFAULT,
    )  # fmt: skip
    if status:
        raise DeviceError("cublasGemmStridedBatchedEx failed", status=status, m=m, n=n, k=k)


def _lead(op: str, a: TensorSpec, b: TensorSpec) -> tuple[tuple[int, ...], int, int, int]:
    """(leading output shape, batch count, element stride of A's and B's matrices)."""
    la, lb = a.shape[:-2], b.shape[:-2]
    if len(la) != len(lb):
        raise InvalidInput(f"{op}: A and B need one rank", a=a.shape, b=b.shape)
    sa, sb = a.shape[-2] * a.shape[-1], b.shape[-2] * b.shape[-1]
    if la == lb:
        return la, int(np.prod(la, dtype=np.int64)), sa, sb
    if all(d == 1 for d in lb):
        return la, int(np.prod(la, dtype=np.int64)), sa, 0
    if all(d == 1 for d in la):
        return lb, int(np.prod(lb, dtype=np.int64)), 0, sb
    raise InvalidInput(
        f"{op}: leading dimensions must be equal, or all 1 on one side", a=a.shape, b=b.shape
    )


class MatMul(Op):
    """y = a @ b for two computed tensors of one float dtype, rank >= 2."""

    name = "matmul"
    n_inputs = (2, 2)

    def _plan(self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]) -> OpPlan:
        a, b = specs
        for what, s in (("A", a), ("B", b)):
            check_dtype(self.name, what, s, FLOAT_DTYPES)
            check_positive(self.name, what, s)
            if len(s.shape) < 2:
                raise InvalidInput(f"{self.name}: {what} needs rank >= 2", shape=s.shape)
        if a.dtype != b.dtype:
            raise InvalidInput("matmul: A and B must share a dtype", a=a.dtype, b=b.dtype)
        m, k = a.shape[-2:]
        k2, n = b.shape[-2:]
        if k != k2:
            raise InvalidInput("matmul: inner dimensions differ", a=a.shape, b=b.shape)
        lead, count, sa, sb = _lead(self.name, a, b)
        out = TensorSpec((*lead, m, n), a.dtype)
        return OpPlan(
            self.name,
            specs,
            (out,),
            0,
            flops=2 * count * m * n * k,
            bytes_moved=a.nbytes + b.nbytes + out.nbytes,
            detail=(count, m, n, k, sa, sb),
        )

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        np.matmul(inputs[0], inputs[1], out=outputs[0])

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Any,
    ) -> None:
        count, m, n, k, sa, sb = plan.detail
        a, b, y = inputs[0], inputs[1], outputs[0]
        gemm_batched_rowmajor(
            stream, _cuda.ptr(a), _cuda.ptr(b), _cuda.ptr(y), m, n, k, count, sa, sb, a.dtype
        )


MATMUL = MatMul()
