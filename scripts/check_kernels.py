"""Compile every CUDA kernel source with nvcc for sm_90, for both dtypes: a check that needs no GPU.

    python scripts/check_kernels.py        # exit 1 on the first source that fails

NVRTC (what cupy uses at run time) accepts the same device code; this catches syntax and
type errors before a GPU machine is even started, and prints register/spill counts.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pipeline.ops import _cuda  # noqa: E402


def sources() -> list[tuple[str, str]]:
    import pipeline.ops as ops
    import pipeline.transport as transport

    found = []
    for pkg in (ops, transport):
        for info in pkgutil.iter_modules(pkg.__path__):
            mod = importlib.import_module(f"{pkg.__name__}.{info.name}")
            src = getattr(mod, "SOURCE", None)
            if isinstance(src, str):
                found.append((mod.__name__, src))
    return found


def nvrtc_compile(lib: str, code: str, name: str) -> tuple[bool, str]:
    """Compile with NVRTC itself, as cupy does at run time (options like cupy's)."""
    import ctypes

    nv = ctypes.CDLL(lib)
    prog = ctypes.c_void_p()
    rc = nv.nvrtcCreateProgram(ctypes.byref(prog), code.encode(), name.encode(), 0, None, None)
    if rc:
        return False, f"nvrtcCreateProgram failed: {rc}"
    opts = [b"-arch=compute_90", b"--std=c++17"]
    inc = os.environ.get("CUDA_INCLUDE")
    if inc:
        opts.append(b"-I" + inc.encode())
    arr = (ctypes.c_char_p * len(opts))(*opts)
    rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nv.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nv.nvrtcGetProgramLog(prog, log)
    nv.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc == 0, log.value.decode(errors="replace")


def main() -> int:
    lib = os.environ.get("NVRTC_LIB")
    if lib:
        failed = 0
        for name, src in sources():
            for dtype in ("float16", "float32"):
                ok, log = nvrtc_compile(lib, _cuda.full_source(src, dtype), f"{name}.cu")
                print(f"{'ok' if ok else 'FAILED':6} nvrtc {name} [{dtype}]")
                if not ok:
                    failed += 1
                    print(log[-3000:])
        return 1 if failed else 0
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("nvcc not found; nothing checked")
        return 0
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in sources():
            for dtype in ("float16", "float32"):
                path = os.path.join(tmp, f"{name}.{dtype}.cu")
                with open(path, "w") as f:
                    f.write(_cuda.full_source(src, dtype))
                r = subprocess.run(
                    [
                        nvcc,
                        "-std=c++17",
                        "-arch=sm_90",
                        "-c",
                        "-Xptxas",
                        "-v",
                        path,
                        "-o",
                        path + ".o",
                    ],
                    capture_output=True,
                    text=True,
                )
                status = "ok" if r.returncode == 0 else "FAILED"
                spills = [
                    ln
                    for ln in r.stderr.splitlines()
                    if "spill" in ln and " 0 bytes spill" not in ln
                ]
                print(
                    f"{status:6} {name} [{dtype}]"
                    + (f"  ({len(spills)} kernels spill)" if spills else "")
                )
                if r.returncode:
                    failed += 1
                    print(r.stderr[-3000:])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
