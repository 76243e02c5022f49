"""Safe parsing of what a client sends: integers from headers, finite numbers, tensor
shapes, parameter objects, JSON. Pure functions, no Ray, no web framework; each either
returns a value of the promised type and range or raises ``InvalidInput`` (a 400) that
names the offending value -- never ``OverflowError``, ``RecursionError``, ``TypeError``
or a number that wraps. Any parser of client input (v1, v2, later routes) calls these.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pipeline.errors import InvalidInput

# A tensor dimension or element count no request can reach: the body limit is at most 1 GB.
MAX_DIM = 1 << 31
MAX_HEADER_DIGITS = 19  # any larger decimal does not fit int64


def header_int(raw: str | None, name: str, lo: int = 0, hi: int = 1 << 62) -> int | None:
    """A non-negative decimal integer header (ASCII digits only: ``str.isdigit`` also takes
    '²' and other Unicode digits, which ``int`` then refuses); None when absent."""
    if raw is None:
        return None
    s = raw.strip()
    if not s or len(s) > MAX_HEADER_DIGITS or not s.isascii() or not s.isdigit():
        raise InvalidInput(f"{name} must be a non-negative integer", value=raw[:64])
    v = int(s)
    if not lo <= v <= hi:
        raise InvalidInput(f"{name} out of range [{lo}, {hi}]", value=v)
    return v


def finite_float(raw: str, name: str, lo: float, hi: float) -> float:
    """A number in (lo, hi]; 400 for anything else, NaN and infinities included (``1e400``
    parses to infinity)."""
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise InvalidInput(f"{name} must be a number", value=str(raw)[:64]) from None
    if not math.isfinite(v) or not lo < v <= hi:
        raise InvalidInput(f"{name} out of range ({lo:g}, {hi:g}]", value=str(raw)[:64])
    return v


def shape_of(v: Any, what: str = "tensor", max_elements: int = MAX_DIM) -> tuple[int, ...]:
    """A tensor shape: a list of non-negative integers (JSON ``true`` is not one), each and
    their product at most ``max_elements`` -- computed in Python integers, so
    ``[2**32, 2**32, 1, 1]`` is refused rather than wrapped to 0 elements."""
    if not isinstance(v, list) or len(v) > 32:
        raise InvalidInput(f"{what}'s shape must be a list of at most 32 integers", shape=v)
    count = 1
    for d in v:
        if type(d) is not int or not 0 <= d <= max_elements:
            raise InvalidInput(
                f"{what}'s shape must be a list of non-negative integers",
                shape=v,
                max_dim=max_elements,
            )
        count *= d
    if count > max_elements:
        raise InvalidInput(
            f"{what}'s shape has too many elements", shape=v, max_elements=max_elements
        )
    return tuple(v)


def element_count(shape: tuple[int, ...]) -> int:
    """The number of elements of a shape from ``shape_of`` (a Python int: no wrap)."""
    n = 1
    for d in shape:
        n *= d
    return n


def params_of(obj: dict, where: str) -> dict:
    """An object's ``parameters``: absent or null is empty, anything but an object is 400."""
    p = obj.get("parameters")
    if p is None:
        return {}
    if not isinstance(p, dict):
        raise InvalidInput(f"{where}.parameters must be an object", got=type(p).__name__)
    return p


def object_list(v: Any, where: str, min_len: int = 0, max_len: int = 1 << 16) -> list[dict]:
    """A JSON list of objects."""
    if not isinstance(v, list) or not min_len <= len(v) <= max_len:
        raise InvalidInput(f"{where} must be a list of {min_len} to {max_len} objects")
    for i, o in enumerate(v):
        if not isinstance(o, dict):
            raise InvalidInput(f"{where}[{i}] must be an object", got=type(o).__name__)
    return v


def json_loads(data: bytes | str, what: str = "request") -> Any:
    """JSON, with nesting too deep for the parser (``RecursionError``) a 400 like any other
    malformed JSON."""
    try:
        return json.loads(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, a 5000-digit integer
        raise InvalidInput(f"{what} is not valid JSON", detail=str(exc)[:200]) from None
    except RecursionError:
        raise InvalidInput(f"{what} is nested too deeply") from None


def optional_str(v: Any, name: str, max_len: int = 256) -> str | None:
    """A string field (a number is taken as its decimal form); anything else is 400."""
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, str | int):
        raise InvalidInput(f"{name} must be a string", got=type(v).__name__)
    s = str(v)
    if len(s) > max_len:
        raise InvalidInput(f"{name} is too long", length=len(s), max_length=max_len)
    return s
