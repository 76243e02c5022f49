"""Entries of the model repository: an engine, a source, and how images are prepared.

The shape of an entry and its values only: whether its engine is one Ferry has and its files
exist and can be read is checked by ``pipeline.check`` (``ferry config check``, the build)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .base import Strict
from .runtime import checked_buckets
from .tasks import TaskName, TaskOutputConfig, check_task_fields


class ModelInputConfig(Strict):
    """How images are prepared for a model (the image path); every field left out comes from
    the model file where it declares it, else from the engine's defaults (torchvision's:
    224x224 RGB, NCHW float32, ImageNet mean/std, crop)."""

    height: int | None = Field(None, ge=1, le=8192)
    """Input height in pixels."""
    width: int | None = Field(None, ge=1, le=8192)
    """Input width in pixels."""
    channels: Literal[1, 3] | None = None
    """1: grayscale, 3: RGB."""
    layout: Literal["nchw", "nhwc"] | None = None
    """Layout of the model's own input tensor (what a v2 request sends)."""
    dtype: Literal["float32", "float16", "uint8"] | None = None
    """Dtype of the model's own input tensor."""
    mean: tuple[float, ...] | None = None
    """Per-channel mean on the [0, 1] scale, subtracted on the device before the model."""
    std: tuple[float, ...] | None = None
    """Per-channel standard deviation on the [0, 1] scale."""
    resize: Literal["crop", "fit", "stretch"] | None = None
    """``crop``: scale the short side to size/0.875 and cut the centre; ``fit``: scale the
    whole image inside the size and pad the rest black; ``stretch``: scale to the size."""

    @model_validator(mode="after")
    def _per_channel(self) -> ModelInputConfig:
        for what in ("mean", "std"):
            v = getattr(self, what)
            if v is not None and self.channels is not None and len(v) != self.channels:
                raise ValueError(f"input.{what} has {len(v)} values for {self.channels} channels")
        if self.std is not None and any(x <= 0 for x in self.std):
            raise ValueError(f"input.std must be positive, got {self.std}")
        return self


BUILTIN_ARCHS = ("resnet50", "digits")
MODEL_FILE_SUFFIXES = (".pt", ".pt2", ".ts", ".jit", ".onnx", ".pth")


@dataclass(frozen=True)
class ModelBatch:
    """A model's batch sizes -- the one owner of them: its buckets (the entry's, else the
    executor's, cut at the entry's ``max_batch``) and the largest, the rows its GPU batches
    hold at most. The executor runs its buckets, the scheduler fills its batches to
    ``max_batch``, and ``/v2/models/{m}/config`` and ``ferry models`` tell both."""

    buckets: tuple[int, ...]

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]


class ModelConfig(Strict):
    """One entry of the model repository: a name, an engine and a source."""

    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """The name in URLs (``/v1/models/{name}/classify``, ``/v2/models/{name}/infer``)."""
    engine: str = "native"
    """``native`` (Ferry's op graph), ``torch`` (the ``[torch]`` extra) or ``onnx``; any name in
    ``pipeline.engines.ENGINES`` (checked by ``pipeline.check``)."""
    source: str | None = None
    """``native``: a built-in architecture (``resnet50``, ``digits``). ``torch``: a torchvision
    architecture name (with ``weights``: its state-dict file), a TorchScript file (``.pt``,
    ``.ts``), a ``torch.export`` archive (``.pt2``) or ``package.module:function`` returning
    a module. ``onnx``: an ``.onnx`` file. Local paths only."""
    arch: Literal["resnet50", "digits"] | None = None
    """The earlier spelling of ``{engine: native, source: ARCH}``; still accepted."""
    weights: str | None = None
    """``native``: an ``.npz``/``.safetensors`` file (``None``: the built-in default, random
    for resnet50). ``torch`` with a torchvision name: the state-dict file (``None``: random)."""
    seed: int = Field(0, ge=0)
    """Seed of random weights when none are given."""
    input: ModelInputConfig = Field(default_factory=ModelInputConfig)
    """How images are prepared for the model (see ``ModelInputConfig``)."""
    labels: str | None = None
    """A text file, one class label a line; its line count must equal the model's classes."""
    task: TaskName | None = None
    """What the model answers: ``classify`` (top-k classes), ``image`` (an image), ``segment``
    (a class per pixel), ``detect`` (boxes) or ``tensors`` (v2 only); ``None``: from its
    outputs when it loads (``pipeline.tasks.resolve``), ``classify`` for an [N, C] output."""
    output: TaskOutputConfig | None = None
    """How the output is read for the task (``TaskOutputConfig``); needs ``task``."""
    buckets: tuple[int, ...] | None = None
    """The padded batch sizes this model runs at (one CUDA graph each); ``None``: the
    executor's (``executor.buckets``)."""
    max_batch: int | None = Field(None, ge=1, le=4096)
    """Largest batch this model is run at: its buckets stop there, and its GPU batches leave
    when they hold this many rows; ``None``: its largest bucket. ``ModelBatch`` is the one
    place this is resolved."""
    precision: Literal["auto", "float16", "float32"] = "auto"
    """The model's compute dtype. ``auto``: the executor's (``executor.dtype``), except that
    where that is float16 the model is probed when it loads -- one batch in float16 and in
    float32 -- and served in float32 when its float16 output is not finite or is far from
    float32's (``pipeline/executor_precision.py`` says how far). ``float16`` or ``float32``:
    that dtype, no probe (an engine that computes only in float32, such as torch on the
    CPU, stays float32)."""
    backend: Literal["auto", "native", "torch"] = "auto"
    """``onnx`` only: what runs the imported graph. ``native``: Ferry's ops (numpy, cupy);
    ``torch``: the graph lowered to a torch module (the ``[torch]`` extra) and served as the
    torch engine serves one (compiled, in CUDA graphs, on a GPU; eager on the CPU); ``auto``:
    ``torch`` on a GPU where torch is installed, ``native`` otherwise
    (``pipeline/engines/onnx.py``)."""
    compile: Literal["static", "dynamic"] = "static"
    """``torch`` only: how its module is compiled on a GPU. ``static``: one compile a bucket;
    ``dynamic``: the batch dimension symbolic, so one compile serves every bucket (a bucket of
    1 compiles apart, as does a range of sizes where a kernel's choice guards one), each
    bucket captured from it as a CUDA graph of its own -- many buckets, so little padding, at
    about one compile's start-up (vLLM compiles once for its batch sizes the same way)."""
    required: bool = False
    """Whether the application cannot serve without this model: refused at load (a file
    Ferry cannot run), it fails the inference replica's start -- Serve's ``DEPLOY_FAILED``
    -- instead of being answered with 503 ``ModelUnavailable`` beside the models that load
    (``pipeline/models/loading.py``)."""

    @property
    def source_file(self) -> str | None:
        """The local file the source names (a path, or a name with a model file's suffix);
        ``None``: a built-in or torchvision architecture, or ``module:function``."""
        src = self.source
        if self.engine == "native" or src is None:
            return None
        return src if os.sep in src or src.endswith(MODEL_FILE_SUFFIXES) else None

    def files(self) -> dict[str, str]:
        """The files the entry names, by what they are (``source``, ``weights``, ``labels``):
        whether they exist and can be read is ``pipeline.check``'s to say."""
        named = {"source": self.source_file, "weights": self.weights, "labels": self.labels}
        return {what: path for what, path in named.items() if path is not None}

    @field_validator("buckets")
    @classmethod
    def _buckets_sorted(cls, v: tuple[int, ...] | None) -> tuple[int, ...] | None:
        return None if v is None else checked_buckets(v)

    def batch(self, executor_buckets: tuple[int, ...]) -> ModelBatch:
        """This model's batch sizes, given the executor's default buckets."""
        base = self.buckets or executor_buckets
        return ModelBatch(tuple(b for b in base if self.max_batch is None or b <= self.max_batch))

    @model_validator(mode="after")
    def _resolve(self) -> ModelConfig:
        if self.arch is not None:
            if self.source is not None and self.source != self.arch:
                raise ValueError(f"model {self.name!r}: give arch or source, not both")
            if self.engine != "native":
                raise ValueError(f"model {self.name!r}: arch is the native engine's spelling")
            object.__setattr__(self, "source", self.arch)
        if self.source is None:
            raise ValueError(f"model {self.name!r}: a source is required")
        if self.engine == "native" and self.source not in BUILTIN_ARCHS:
            raise ValueError(
                f"model {self.name!r}: the native engine builds {list(BUILTIN_ARCHS)}, "
                f"not {self.source!r} (an ONNX file is engine: onnx)"
            )
        check_task_fields(self.name, self.task, self.output)
        if self.backend != "auto" and self.engine != "onnx":
            raise ValueError(f"model {self.name!r}: backend is the onnx engine's option")
        if self.compile != "static" and self.engine != "torch":
            raise ValueError(f"model {self.name!r}: compile is the torch engine's option")
        src = self.source
        if self.engine != "native" and self.source_file is None and ":" in src:
            mod, _, fn = src.partition(":")
            if not (mod and fn.isidentifier() and all(p.isidentifier() for p in mod.split("."))):
                raise ValueError(
                    f"model {self.name!r}: source {src!r} is neither a file nor module:function"
                )
        return self
