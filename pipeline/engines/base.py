"""The engine contract: the two phases of ``ops/base.py``, at the level of a whole model.

    engine = NativeEngine(model)                 # built by ``engines.create`` at load time
    engine.load(ctx)                             # weights onto the device (once)
    plan = engine.plan(bucket, feed)             # specs, arena bytes, estimate; no device work
    bound = engine.bind(plan, arena)             # views into Ferry's arena; no allocation
    bound.run(stream)                            # enqueue only: no allocation, no sync
    graph = bound.capture(stream)                # a CUDA graph of ``run`` (``.launch(raw)``)
    outs = engine.trial(ctx, feed, stream)       # one probe batch in ctx.dtype, on the host

``plan`` touches no device: the input and output specs of a bucket, how many bytes of Ferry's
arena one batch needs (inputs and outputs always live there, so Ferry's pinned ring copies
straight in and out), what the engine holds outside the arena, and an estimate of the work.
``run`` enqueues one batch onto Ferry's stream and returns; ``capture`` records it as a
CUDA graph that the executor replays. Everything around it -- streams, the pool and its
reservations, the pinned ring, CUDA graphs per bucket, in-flight depth, admission control,
naive mode, warm-up -- is the executor's and the same for every engine.

A model has its own input tensors (``inputs``: what a v2 request sends, by name) and, where
it classifies images, an ``image`` feed: uint8 [N, H, W, C] from Ferry's image path, which
the engine normalises on the device before the model runs (``feed="image"``). Engines whose
own input already is that uint8 image (the built-ins) serve both feeds with one plan.

An engine's context is its model's own: the executor decides each model's compute dtype once,
at load (``executor_precision.choose``: the entry's ``precision``, else the executor's dtype,
probed with ``trial`` where that is float16), and loads the engine with that context.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import numpy as np

from ..device import Backend, Stream
from ..errors import InvalidInput
from ..ops.base import TensorSpec

Feed = Literal["image", "tensors"]


@dataclass(frozen=True)
class TensorInfo:
    """A named tensor of a model's signature; ``-1`` is the batch dimension."""

    name: str
    dtype: str  # numpy name: "uint8", "float32", ...
    shape: tuple[int, ...]  # with the batch as -1 first

    def at(self, batch: int) -> TensorSpec:
        return TensorSpec((batch, *self.shape[1:]), self.dtype)


@dataclass(frozen=True)
class ImageInput:
    """How Ferry's image path prepares pixels for the model (the ``image`` feed)."""

    height: int
    width: int
    channels: int  # 1 or 3
    mean: tuple[float, ...]  # on the [0, 1] scale
    std: tuple[float, ...]
    layout: Literal["nchw", "nhwc"] = "nchw"  # the model's own input layout
    resize: Literal["crop", "fit", "stretch"] = "crop"


@dataclass(frozen=True)
class EnginePlan:
    """What ``Engine.plan`` decided for one bucket and feed."""

    engine: str
    model: str
    bucket: int
    feed: Feed
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    arena_bytes: int  # of Ferry's pool, per batch in flight (inputs and outputs included)
    held_bytes: int = 0  # what the engine keeps outside the arena (known after warm-up)
    flops: int = 0
    bytes_moved: int = 0
    detail: Any = field(default=None, compare=False, repr=False)

    @property
    def input_spec(self) -> TensorSpec:
        return self.inputs[0]

    @property
    def output_specs(self) -> tuple[TensorSpec, ...]:
        return self.outputs


class BoundModel(Protocol):
    """A plan bound to one arena: ``input`` and ``outputs`` are views into it."""

    input: Any
    outputs: tuple[Any, ...]

    def run(self, stream: Stream) -> None: ...

    def capture(self, stream: Stream) -> Any: ...


PROBE_SEED = 29  # the precision probe's input: the same seeded batch for every dtype


def probe_input(spec: TensorSpec, seed: int = PROBE_SEED) -> np.ndarray:
    """A deterministic batch of ``spec``: uniform bytes for a uint8 image, standard normal
    values for a float tensor, small integers otherwise."""
    rng = np.random.default_rng(seed)
    dt = spec.np_dtype
    if dt == np.uint8:
        return rng.integers(0, 256, spec.shape, dtype=np.uint8)
    if np.issubdtype(dt, np.floating):
        return rng.standard_normal(spec.shape).astype(dt)
    if dt == np.bool_:
        return rng.integers(0, 2, spec.shape).astype(np.bool_)
    return rng.integers(0, 8, spec.shape).astype(dt)


@dataclass
class EngineContext:
    """What the executor hands an engine at load time: one model's own."""

    backend: Backend
    dtype: str  # the model's compute dtype (the executor's default: float16 on the GPU)
    target: str  # "cuda" or "host"
    max_workspace_bytes: int
    pool: Any  # the executor's pool: an engine that holds device memory of its own counts it here


class Engine(ABC):
    """One model behind the two-phase contract. Subclasses live one to a file."""

    name: ClassVar[str] = "engine"
    trial_loads: ClassVar[bool] = True
    """Whether ``trial`` leaves the engine loaded as ``load`` would (the default trial loads
    then runs); an engine whose trial runs something else (torch: eager, not compiled) is
    loaded once more in the dtype the probe keeps."""
    late_capture: ClassVar[bool] = True
    """Whether a batch that gets an arena its bucket has not had after the warm-up may be
    captured as a CUDA graph (else it runs eagerly). Torch's capture syncs the device and
    empties torch's device and host caches (``torch.cuda.graph``'s entry; the torch engine's
    own capture syncs before it), which under load stalls every batch of the replica, so the
    torch engine does not."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.ctx: EngineContext | None = None

    # -- the model's own signature (v2 metadata, request checks)
    @property
    @abstractmethod
    def inputs(self) -> tuple[TensorInfo, ...]: ...

    @property
    @abstractmethod
    def outputs(self) -> tuple[TensorInfo, ...]: ...

    @property
    def feeds(self) -> tuple[Feed, ...]:
        """The feeds this engine plans; the image feed only where it classifies images."""
        return ("image", "tensors")

    def feed_for(self, feed: Feed) -> Feed:
        """The feed that plans ``feed`` (an engine whose own input is the uint8 image
        answers ``image`` for both, so both share plans and CUDA graphs)."""
        if feed not in self.feeds:
            raise InvalidInput("this model has no such feed", model=self.model, feed=feed)
        return feed

    @property
    def weights_bytes(self) -> int:
        return 0

    # -- loading and the two phases
    @abstractmethod
    def load(self, ctx: EngineContext) -> None:
        """Weights onto the device (or host), once, before any plan is bound."""

    @abstractmethod
    def plan(self, bucket: int, feed: Feed = "image") -> EnginePlan:
        """Plan a bucket without touching the device; cached by the engine."""

    @abstractmethod
    def bind(self, plan: EnginePlan, arena: Any) -> BoundModel:
        """Views of the plan's tensors in ``arena`` (flat uint8, >= ``plan.arena_bytes``)."""

    def dtype_in(self, ctx: EngineContext) -> str:
        """The dtype this engine computes in when loaded with ``ctx`` (an engine that has
        only a float32 path on some target says so)."""
        return ctx.dtype

    def trial(self, ctx: EngineContext, feed: Feed, stream: Stream) -> tuple[np.ndarray, ...]:
        """The precision probe's run: loaded with ``ctx`` (replacing what was loaded), one
        batch of ``probe_input`` through ``feed`` at bucket 1, outputs copied to the host.
        Load time only: it reserves its arena from the pool and waits for the stream."""
        self.load(ctx)
        plan = self.plan(1, feed)
        with ctx.pool.reserve(plan.arena_bytes) as r:
            try:
                bound = self.bind(plan, r.buffer)
                stream.copy_h2d(bound.input, probe_input(plan.input_spec))
                bound.run(stream)
                outs = tuple(np.empty(o.shape, o.dtype) for o in bound.outputs)
                for host, dev in zip(outs, bound.outputs, strict=True):
                    stream.copy_d2h(host, dev)
            finally:
                stream.synchronize()  # the arena goes back only once the stream is done
        return outs

    def warm_gate(self, buckets: tuple[int, ...]) -> contextlib.AbstractContextManager:
        """What the warm-up of ``buckets`` runs under: nothing by default; an engine that
        compiles on a GPU takes the machine's compile gate (``compile_gate.py``)."""
        return contextlib.nullcontext()

    def close(self) -> None:  # noqa: B027 - optional for engines that hold nothing
        """Give back what the engine holds (device memory, accounted bytes)."""
