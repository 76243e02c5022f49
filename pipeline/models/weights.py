"""Weight files: ``.npz`` (read with ``allow_pickle=False``) and ``.safetensors``.

The safetensors format is an 8-byte little-endian header length, a JSON header naming each
tensor's dtype, shape and byte range, then the raw bytes; reading it needs no library.
Nothing here ever unpickles.
"""

from __future__ import annotations

import json
import os
import struct

import numpy as np

from ..errors import InvalidInput

_ST_DTYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_ST_NAMES = {np.dtype(v).name: k for k, v in _ST_DTYPES.items()}


def load_weights(path: str) -> dict[str, np.ndarray]:
    """Arrays by name from an ``.npz`` or ``.safetensors`` file."""
    if not os.path.exists(path):
        raise InvalidInput("weights file not found", path=path)
    if path.endswith(".npz"):
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    if path.endswith(".safetensors"):
        return _read_safetensors(path)
    raise InvalidInput("weights must be .npz or .safetensors", path=path)


def save_weights(path: str, arrays: dict[str, np.ndarray]) -> None:
    if path.endswith(".npz"):
        np.savez_compressed(path, **arrays)
    elif path.endswith(".safetensors"):
        _write_safetensors(path, arrays)
    else:
        raise InvalidInput("weights must be .npz or .safetensors", path=path)


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise InvalidInput("not a safetensors file (too short)", path=path)
    (n,) = struct.unpack("<Q", raw[:8])
    if n > len(raw) - 8:
        raise InvalidInput("not a safetensors file (header length)", path=path, header_bytes=n)
    header = json.loads(raw[8 : 8 + n])
    data = memoryview(raw)[8 + n :]
    out: dict[str, np.ndarray] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        dt = meta["dtype"]
        if dt not in _ST_DTYPES:
            raise InvalidInput("unsupported safetensors dtype", tensor=name, dtype=dt)
        start, end = meta["data_offsets"]
        arr = np.frombuffer(data[start:end], dtype=_ST_DTYPES[dt]).reshape(meta["shape"])
        out[name] = arr.copy()
    return out


def _write_safetensors(path: str, arrays: dict[str, np.ndarray]) -> None:
    header: dict[str, dict] = {}
    blobs: list[bytes] = []
    off = 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a)
        if a.dtype.name not in _ST_NAMES:
            raise InvalidInput("unsupported dtype for safetensors", tensor=name, dtype=a.dtype.name)
        b = a.tobytes()
        header[name] = {
            "dtype": _ST_NAMES[a.dtype.name],
            "shape": list(a.shape),
            "data_offsets": [off, off + len(b)],
        }
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
