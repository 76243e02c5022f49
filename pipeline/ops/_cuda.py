"""Compiling and launching Ferry's CUDA kernels (cupy ``RawModule``), and cuBLAS GEMM.

Each op family keeps its CUDA source as a string; ``kernel(source, name, dtype)`` compiles
it once per (source, dtype, device) with ``T`` bound to ``__half`` or ``float``. Launches
go on the stream passed to ``commit`` (cupy's current stream inside ``with stream``).
Nothing here runs unless a CUDA device is in use.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

import numpy as np

from ..errors import DeviceError

_PRELUDE = r"""
#include <cuda_fp16.h>
typedef {ctype} T;
#define FERRY_INF (__int_as_float(0x7f800000))
template <typename X> __device__ __forceinline__ float tof(X v) {{ return static_cast<float>(v); }}
template <> __device__ __forceinline__ float tof<__half>(__half v) {{ return __half2float(v); }}
__device__ __forceinline__ T fromf(float v) {{ return static_cast<T>(v); }}
template <int V> struct alignas(16) VecT {{ T v[V]; }};
constexpr int VEC = 16 / sizeof(T);
// the grid-stride loop every elementwise kernel runs over [0, total)
#define FERRY_FOR(i, total) \
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (total); \
       i += (long long)gridDim.x * blockDim.x)
// (n, oh, ow, c) of a flat index into an NHWC tensor [N, OH, OW, C]
struct NhwcIdx {{ long long n; int oh, ow, c; }};
__device__ __forceinline__ NhwcIdx nhwc_index(long long i, int OH, int OW, int C) {{
  NhwcIdx r;
  r.c = (int)(i % C);
  long long t = i / C;
  r.ow = (int)(t % OW);
  t /= OW;
  r.oh = (int)(t % OH);
  r.n = t / OH;
  return r;
}}
"""

_CTYPE = {"float16": "__half", "float32": "float"}
_lock = threading.Lock()
_modules: dict[tuple[int, str, int], Any] = {}

THREADS = 256


def ctype(dtype: Any) -> str:
    name = np.dtype(dtype).name
    if name not in _CTYPE:
        raise DeviceError("no CUDA kernel for this dtype", dtype=name)
    return _CTYPE[name]


def kernel(source: str, name: str, dtype: Any = "float32") -> Any:
    """The compiled kernel ``name`` of ``source`` with ``T`` = ``dtype`` on the current device."""
    import cupy  # optional: cupy, the GPU backend

    dev = cupy.cuda.Device().id
    key = (id(source), np.dtype(dtype).name, dev)
    mod = _modules.get(key)
    if mod is None:
        with _lock:
            mod = _modules.get(key)
            if mod is None:
                code = _PRELUDE.format(ctype=ctype(dtype)) + source
                mod = cupy.RawModule(code=code, options=("-std=c++17",))
                _modules[key] = mod
    return mod.get_function(name)


def full_source(source: str, dtype: Any) -> str:
    """The exact text ``kernel`` compiles (for offline checks with nvcc)."""
    return _PRELUDE.format(ctype=ctype(dtype)) + source


def grid_for(n: int, threads: int = THREADS, cap: int = 132 * 16) -> int:
    """Blocks for ``n`` threads' worth of work; kernels use grid-stride loops past ``cap``."""
    return max(1, min((int(n) + threads - 1) // threads, cap))


def launch(kern: Any, n: int, args: tuple, threads: int = THREADS, cap: int = 132 * 16) -> None:
    if n <= 0:
        return
    kern((grid_for(n, threads, cap),), (threads,), args)


# --------------------------------------------------------------------------- cuBLAS

_CUDA_R_16F = 2
_CUDA_R_32F = 0
_CUBLAS_COMPUTE_32F = 68
_CUBLAS_GEMM_DEFAULT = -1
_CUDA_DT = {"float16": _CUDA_R_16F, "float32": _CUDA_R_32F}
_ONE = np.ones(1, dtype=np.float32)
_ZERO = np.zeros(1, dtype=np.float32)


_gemm_ex: Any = None


def _loaded_library(stem: str) -> str | None:
    """The path of an already-mapped shared library whose file name starts with ``stem``."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if os.path.basename(path).startswith(stem):
                    return path
    except OSError:
        pass
    return None


def _cublas_gemm_ex() -> Any:
    """``cublasGemmEx`` itself, through ctypes, from the libcublas cupy already loaded.

    cupy's own wrapper re-binds the handle to cupy's current stream on every call and
    refuses to run while a stream is capturing; Ferry's handles are bound to their stream
    once (``Stream.cublas_handle``), so calling the library directly is both leaner on the
    hot path and what lets GEMMs be recorded into CUDA graphs.
    """
    global _gemm_ex
    if _gemm_ex is None:
        from cupy_backends.cuda.libs import cublas  # noqa: F401  (maps libcublas)

        path = _loaded_library("libcublas.so") or ctypes.util.find_library("cublas")
        if path is None:
            raise DeviceError("libcublas is not loaded and cannot be found")
        f = ctypes.CDLL(path).cublasGemmEx
        f.restype = ctypes.c_int
        vp, i = ctypes.c_void_p, ctypes.c_int
        f.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i]
        _gemm_ex = f
    return _gemm_ex


def gemm_rowmajor(
    stream: Any,
    a_ptr: int,
    b_ptr: int,
    c_ptr: int,
    m: int,
    n: int,
    k: int,
    dtype: Any,
    lda: int | None = None,
    ldb: int | None = None,
    ldc: int | None = None,
) -> None:
    """C[m, n] = A[m, k] @ B[k, n], all row-major, fp32 accumulation, on ``stream``.

    cuBLAS is column-major, so this computes C^T = B^T A^T: the row-major B seen
    column-major *is* B^T, and likewise for A and C; no transposes are needed.
    """
    dt = _CUDA_DT[np.dtype(dtype).name]
    status = _cublas_gemm_ex()(
        stream.cublas_handle,
        0,
        0,
        int(n),
        int(m),
        int(k),
        _ONE.ctypes.data,
        int(b_ptr),
        dt,
        int(ldb or n),
        int(a_ptr),
        dt,
        int(lda or k),
        _ZERO.ctypes.data,
        int(c_ptr),
        dt,
        int(ldc or n),
        _CUBLAS_COMPUTE_32F,
        _CUBLAS_GEMM_DEFAULT,
    )
    if status:
        raise DeviceError(
            "cublasGemmEx failed", status=status, m=m, n=n, k=k, dtype=np.dtype(dtype).name
        )


def ptr(array: Any) -> int:
    return int(array.data.ptr)
