"""The two-phase operator contract (after Ascend's aclnn).

    plan = op.prepare(*input_specs, **attrs)     # validate, size, plan; no device work
    op.commit(plan, inputs, outputs, workspace, stream)   # enqueue only

``prepare`` raises ``InvalidInput`` naming the offending values, computes the output specs,
the workspace it needs and an estimate of FLOPs and bytes moved. It touches no device and
allocates nothing, and its plans are cached by (op, specs, attrs).

``commit`` only enqueues work on ``stream``: it never allocates, never synchronizes, never
copies to or from the host. ``inputs`` and ``outputs`` are arrays of the plan's specs
(views into an arena); ``workspace`` is a flat uint8 array of at least
``plan.workspace_bytes`` bytes (or ``None`` when that is 0).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..device import Backend, Stream, is_device_array
from ..errors import InvalidInput

WORKSPACE_ALIGN = 256


@functools.lru_cache(maxsize=256)
def _dtype_name(dtype: Any) -> str:
    return np.dtype(dtype).name


def dtype_name(dtype: Any) -> str:
    """numpy's name of ``dtype`` (a name, a numpy dtype or scalar type), remembered: numpy
    works it out in Python each time (about 5 us), and a GPU fit makes a spec per image."""
    try:
        return _dtype_name(dtype)
    except TypeError:  # (unhashable: a structured dtype's description)
        return np.dtype(dtype).name


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of a tensor; hashable, so plans can be cached by it."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", dtype_name(self.dtype))

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.np_dtype.itemsize

    @functools.cached_property
    def np_dtype(self) -> np.dtype:  # (kept in the instance's dict: eq and hash ignore it)
        return np.dtype(self.dtype)

    @classmethod
    def of(cls, array: Any) -> TensorSpec:
        return cls(tuple(array.shape), np.dtype(array.dtype).name)

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class OpPlan:
    """What ``prepare`` decided: output specs, workspace, cost, and op-specific detail."""

    op: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    workspace_bytes: int = 0
    flops: int = 0
    bytes_moved: int = 0
    attrs: tuple[tuple[str, Any], ...] = ()
    detail: Any = field(default=None, compare=False)

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, np.ndarray):
        return tuple(value.tolist())
    return value


class Op:
    """Base of every operator. Subclasses implement ``_plan``, ``_run_host`` and ``_run_cuda``.

    Operators hold no per-call state: one instance serves every thread.
    """

    name: ClassVar[str] = "op"
    n_inputs: ClassVar[tuple[int, int]] = (1, 1)  # (min, max)
    is_view: ClassVar[bool] = False  # output aliases the input's bytes (reshape)
    planning_attrs: ClassVar[tuple[str, ...]] = ()  # attrs a graph fills in: "target", ...

    def __init__(self) -> None:
        self._prepare_cached = functools.lru_cache(maxsize=4096)(self._prepare_uncached)

    # -- phase one
    def prepare(self, *specs: TensorSpec, **attrs: Any) -> OpPlan:
        lo, hi = self.n_inputs
        if not lo <= len(specs) <= hi:
            raise InvalidInput(f"{self.name} takes {lo}..{hi} inputs", got=len(specs))
        for s in specs:
            if not isinstance(s, TensorSpec):
                raise InvalidInput(f"{self.name} takes TensorSpec inputs", got=type(s).__name__)
        frozen = tuple(sorted((k, _freeze(v)) for k, v in attrs.items()))
        return self._prepare_cached(specs, frozen)

    def _prepare_uncached(
        self, specs: tuple[TensorSpec, ...], attrs: tuple[tuple[str, Any], ...]
    ) -> OpPlan:
        return self._plan(specs, dict(attrs))

    def _plan(
        self, specs: tuple[TensorSpec, ...], attrs: dict[str, Any]
    ) -> OpPlan:  # pragma: no cover
        raise NotImplementedError

    # -- phase two
    def commit(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Stream,
    ) -> None:
        if stream.is_cuda:
            with stream:
                self._run_cuda(plan, inputs, outputs, workspace, stream)
        else:
            self._run_host(plan, inputs, outputs, workspace)

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Stream,
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<op {self.name}>"


class XpOp(Op):
    """An op written once for numpy and cupy: ``run_xp(xp, ...)`` is its one code path, run
    with numpy on the host and with cupy (on the op's stream: ``Op.commit`` enters it)."""

    def run_xp(
        self, xp: Any, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:  # pragma: no cover
        raise NotImplementedError

    def _run_host(
        self, plan: OpPlan, inputs: Sequence[Any], outputs: Sequence[Any], workspace: Any
    ) -> None:
        self.run_xp(np, plan, inputs, outputs, workspace)

    def _run_cuda(
        self,
        plan: OpPlan,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        workspace: Any,
        stream: Stream,
    ) -> None:
        import cupy  # optional: cupy, the GPU backend

        self.run_xp(cupy, plan, inputs, outputs, workspace)


# --------------------------------------------------------------------------- helpers for ops


FLOAT_DTYPES = ("float16", "float32")


def check_dtype(op: str, what: str, spec: TensorSpec, allowed: Sequence[str]) -> None:
    if spec.dtype not in allowed:
        raise InvalidInput(
            f"{op}: {what} has an unsupported dtype", dtype=spec.dtype, allowed=tuple(allowed)
        )


def check_rank(op: str, what: str, spec: TensorSpec, rank: int) -> None:
    if len(spec.shape) != rank:
        raise InvalidInput(f"{op}: {what} must have rank {rank}", shape=spec.shape)


def check_positive(op: str, what: str, spec: TensorSpec) -> None:
    if any(d <= 0 for d in spec.shape):
        raise InvalidInput(f"{op}: {what} has an empty dimension", shape=spec.shape)


def check_tensor(op: str, what: str, spec: TensorSpec, rank: int, allowed: Sequence[str]) -> None:
    """``spec`` has ``rank`` dimensions, none empty, and one of the ``allowed`` dtypes."""
    check_rank(op, what, spec, rank)
    check_positive(op, what, spec)
    check_dtype(op, what, spec, allowed)


def workspace_view(workspace: Any, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
    """A typed view of part of a flat uint8 workspace (no allocation)."""
    dt = np.dtype(dtype)
    n = math.prod(shape) * dt.itemsize
    return workspace[offset : offset + n].view(dt).reshape(shape)


def align(n: int, a: int = WORKSPACE_ALIGN) -> int:
    return (int(n) + a - 1) // a * a


def eager(op: Op, *arrays: Any, stream: Stream | None = None, **attrs: Any) -> tuple[Any, ...]:
    """Prepare and commit ``op`` once on ready arrays, allocating outputs and workspace.

    A convenience for tests, tools and one-off work: it allocates (commit itself never
    does) and, on the GPU, synchronizes before it returns.
    """
    is_cuda = bool(arrays) and is_device_array(arrays[0])
    backend = Backend("cupy" if is_cuda else "numpy")
    xp = backend.xp
    plan = op.prepare(*(TensorSpec.of(a) for a in arrays), **attrs)
    outs = tuple(xp.empty(s.shape, dtype=s.dtype) for s in plan.outputs)
    ws = xp.empty(plan.workspace_bytes, dtype=xp.uint8) if plan.workspace_bytes else None
    own = stream is None
    stream = stream or Stream("eager", backend)
    op.commit(plan, arrays, outs, ws, stream)
    stream.synchronize()
    if own:
        stream.close()
    return outs
