"""Pydantic configuration of a whole Ferry pipeline.

Bounds are enforced with ``Field(ge=..., le=...)``; cross-field checks raise ``ValueError``
naming the values. Process-level switches come from the environment, read here and
nowhere else (``Settings.from_env``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class _Strict(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, use_attribute_docstrings=True
    )


class ExecutorConfig(_Strict):
    """The GPU actor's core: device, pool, streams, buckets, graphs."""

    backend: Literal["auto", "cupy", "numpy"] = "auto"
    """``auto``: cupy when a CUDA device is visible, numpy otherwise."""
    device_id: int = Field(0, ge=0, le=63)
    """CUDA device ordinal (within the devices the process sees)."""
    mode: Literal["real", "naive"] = "real"
    """``naive`` is the baseline: cudaMalloc, synchronous pageable copies, eager compute, cudaFree."""
    buckets: tuple[int, ...] = DEFAULT_BUCKETS
    """Batch sizes are padded up to one of these; one CUDA graph is captured per bucket."""
    max_in_flight: int = Field(3, ge=1, le=16)
    """Batches staged or running at once (pinned staging slots); 2-3 overlaps copies with compute."""
    compute_streams: int = Field(1, ge=1, le=4)
    """Compute streams; batches are spread over them round-robin."""
    pool_limit_bytes: int | None = Field(None, ge=1 << 20)
    """Hard limit of the device pool in bytes; overrides ``pool_limit_fraction``."""
    pool_limit_fraction: float = Field(0.5, gt=0.0, le=0.95)
    """Hard limit of the device pool as a fraction of the device's memory."""
    cuda_graphs: bool = True
    """Capture a CUDA graph per (bucket, arena) at warm-up and replay it."""
    max_workspace_bytes: int = Field(256 << 20, ge=1 << 16, le=8 << 30)
    """Cap on one op's workspace (im2col columns); larger convolutions run in chunks."""
    staging_timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    """How long ``prepare`` waits for a free pinned staging slot before ``ResourceExhausted``."""
    dtype: Literal["auto", "float16", "float32"] = "auto"
    """Compute dtype: ``auto`` is float16 on the GPU, float32 on the CPU."""

    @field_validator("buckets")
    @classmethod
    def _buckets_sorted(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v:
            raise ValueError("buckets must not be empty")
        if any(b < 1 or b > 4096 for b in v):
            raise ValueError(f"buckets must lie in [1, 4096], got {v}")
        if list(v) != sorted(set(v)):
            raise ValueError(f"buckets must be strictly increasing, got {v}")
        return tuple(v)


class BatchingConfig(_Strict):
    """How the inference stage forms GPU batches: full, or the wait ran out."""

    max_batch_size: int = Field(64, ge=1, le=4096)
    """A batch leaves as soon as it holds this many items."""
    max_wait_ms: float = Field(2.0, ge=0.0, le=10_000.0)
    """...or when its oldest item has waited this long."""
    max_queue: int = Field(2048, ge=1, le=1_000_000)
    """Items waiting beyond this are refused at once with ``QueueFull`` (HTTP 503)."""
    retry_after_s: float = Field(1.0, ge=0.0, le=600.0)
    """``Retry-After`` sent with 503 answers."""
    default_deadline_ms: float | None = Field(None, gt=0.0)
    """Deadline given to requests that bring none; ``None``: no deadline."""
    dispatch_when_idle: bool = True
    """When no batch is running, the queue leaves at once instead of waiting ``max_wait_ms``
    (waiting buys nothing then); under load the full-or-timeout rule decides."""


GRPC_LIMIT_ENV = {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str((1 << 31) - 1)}


class DeploymentOptions(_Strict):
    """Ray Serve options of one stage."""

    num_replicas: int | None = Field(1, ge=1, le=1024)
    """Fixed replica count; ``None`` when ``autoscaling_config`` is given."""
    autoscaling_config: dict[str, Any] | None = None
    """Ray Serve autoscaling config (min_replicas, max_replicas, target_ongoing_requests, ...)."""
    max_ongoing_requests: int = Field(256, ge=1, le=100_000)
    """Requests one replica works on at once; keep >= the batch size where batching happens."""
    max_queued_requests: int = Field(-1, ge=-1, le=1_000_000)
    """Requests queued in callers for this stage before Serve answers 503; -1: unbounded."""
    num_cpus: float = Field(1.0, ge=0.0, le=256.0)
    """CPUs reserved per replica."""
    num_gpus: float = Field(0.0, ge=0.0, le=8.0)
    """GPUs per replica; fractions share one device."""
    env_vars: dict[str, str] = Field(default_factory=dict)
    """Environment of the replica processes (e.g. FERRY_AUTH_TOKEN for the ingress)."""
    replicas_per_gpu: int | None = Field(None, ge=1, le=64)
    """Replicas on each GPU instead of ``num_replicas`` and ``num_gpus``: the stage gets
    ``replicas_per_gpu x gpus`` replicas of ``1/replicas_per_gpu`` GPU each (``gpus`` of the
    pipeline config; ``"auto"`` counts the cluster's GPUs when the application is built), so
    one config fits a node of one GPU and a node of eight."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Custom Ray resources each replica needs, e.g. ``{cpu_pool: 1}`` to keep the ingress on
    nodes started with ``--resources '{"cpu_pool": 64}'``."""
    label_selector: dict[str, str] = Field(default_factory=dict)
    """Ray node labels the replicas must run on (``ray start --labels``; KubeRay sets
    ``ray.io/node-group``), e.g. ``{ray.io/node-group: cpu}`` for the ingress of the split form."""
    switch_interval_ms: float | None = Field(None, gt=0.0, le=100.0)
    """Python's GIL switch interval in the replica processes (``sys.setswitchinterval``);
    ``None`` keeps Python's 5 ms. A replica whose worker threads keep the GIL busy makes its
    event loop -- where Serve takes calls and hands back answers -- wait up to this long
    each time it wants the GIL back; a shorter interval trades some CPU for that wait."""

    @property
    def holds_gpu(self) -> bool:
        """A GPU share, given or to come from ``replicas_per_gpu``."""
        return self.num_gpus > 0 or self.replicas_per_gpu is not None

    def apply_in_process(self) -> None:
        """What of these options acts inside the replica process: called by each stage's
        replica as it starts."""
        if self.switch_interval_ms is not None:
            import sys

            sys.setswitchinterval(self.switch_interval_ms / 1e3)

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> DeploymentOptions:
        if self.autoscaling_config is not None and self.num_replicas is not None:
            raise ValueError(
                f"give num_replicas ({self.num_replicas}) or autoscaling_config, not both"
            )
        if self.autoscaling_config is None and self.num_replicas is None:
            raise ValueError("one of num_replicas or autoscaling_config is required")
        if self.replicas_per_gpu is not None:
            given = {"num_replicas", "num_gpus", "autoscaling_config"} & self.model_fields_set
            if given:
                raise ValueError(
                    f"replicas_per_gpu ({self.replicas_per_gpu}) sets the replica count and GPU "
                    f"share; do not also give {sorted(given)}"
                )
        return self

    def serve_options(self) -> dict[str, Any]:
        if self.replicas_per_gpu is not None:
            raise ValueError(
                "replicas_per_gpu is resolved against a GPU count first (pipeline.placement.resolve)"
            )
        actor: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            actor["resources"] = dict(self.resources)
        if self.label_selector:
            actor["label_selector"] = dict(self.label_selector)
        # With gRPC between deployments (RAY_SERVE_THROUGHPUT_OPTIMIZED=1) a replica refuses
        # calls over 4 MB by default -- one large photo, or a coalesced group of small ones
        # -- so every stage takes what its callers can send; its own env_vars win.
        actor["runtime_env"] = {"env_vars": {**GRPC_LIMIT_ENV, **self.env_vars}}
        opts: dict[str, Any] = {
            "max_ongoing_requests": self.max_ongoing_requests,
            "max_queued_requests": self.max_queued_requests,
            "ray_actor_options": actor,
        }
        if self.autoscaling_config is not None:
            opts["autoscaling_config"] = self.autoscaling_config
        else:
            opts["num_replicas"] = self.num_replicas
        return opts


class ModelInputConfig(_Strict):
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


class ModelConfig(_Strict):
    """One entry of the model repository: a name, an engine and a source."""

    name: str = Field(..., min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    """The name in URLs (``/v1/models/{name}/classify``, ``/v2/models/{name}/infer``)."""
    engine: str = "native"
    """``native`` (Ferry's op graph), ``torch`` (the ``[torch]`` extra) or ``onnx``; any name in
    ``pipeline.engines.ENGINES``."""
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
    max_batch: int | None = Field(None, ge=1, le=4096)
    """Largest batch this model is run at (its buckets stop there); ``None``: the executor's."""

    @model_validator(mode="after")
    def _resolve(self) -> ModelConfig:
        import os

        if self.arch is not None:
            if self.source is not None and self.source != self.arch:
                raise ValueError(f"model {self.name!r}: give arch or source, not both")
            if self.engine != "native":
                raise ValueError(f"model {self.name!r}: arch is the native engine's spelling")
            object.__setattr__(self, "source", self.arch)
        from pipeline.engines import ENGINES

        if self.engine not in ENGINES:
            raise ValueError(
                f"model {self.name!r}: unknown engine {self.engine!r}; known: {sorted(ENGINES)}"
            )
        if self.source is None:
            raise ValueError(f"model {self.name!r}: a source is required")
        if self.engine == "native" and self.source not in BUILTIN_ARCHS:
            raise ValueError(
                f"model {self.name!r}: the native engine builds {list(BUILTIN_ARCHS)}, "
                f"not {self.source!r} (an ONNX file is engine: onnx)"
            )
        src = self.source
        is_path = os.sep in src or src.endswith(MODEL_FILE_SUFFIXES)
        if self.engine != "native" and is_path and not os.path.isfile(src):
            raise ValueError(f"model {self.name!r}: source file not found: {src}")
        if self.engine != "native" and not is_path and ":" in src:
            mod, _, fn = src.partition(":")
            if not (mod and fn.isidentifier() and all(p.isidentifier() for p in mod.split("."))):
                raise ValueError(
                    f"model {self.name!r}: source {src!r} is neither a file nor module:function"
                )
        for what in ("weights", "labels"):
            path = getattr(self, what)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"model {self.name!r}: {what} file not found: {path}")
        if self.labels is not None:
            from pipeline.models.repository import read_labels

            read_labels(self.labels)  # raises ValueError naming the file when it is empty
        return self


class IngressConfig(_Strict):
    """The HTTP front."""

    coalesce_window_ms: float = Field(1.0, ge=0.0, le=100.0)
    """Requests arriving within this window go downstream as one call."""
    max_coalesce: int = Field(64, ge=1, le=4096)
    """Most requests in one downstream call."""
    max_groups_in_flight: int = Field(4, ge=1, le=1024)
    """Downstream calls one ingress replica keeps open per model; while they are all out, the
    next group keeps growing (calls follow the pipeline's pace, not the arrival rate)."""
    dispatch_when_idle: bool = True
    """A group that starts while none of this replica's groups is out, and none left within
    the last window, leaves at once instead of waiting ``coalesce_window_ms`` (a lone
    request pays no window; under load the window and ``max_groups_in_flight`` decide)."""
    max_body_bytes: int = Field(8 << 20, ge=1024, le=1 << 30)
    """Bodies over this get 413."""
    max_pixels: int = Field(40_000_000, ge=1, le=1 << 31)
    """Images whose header declares more pixels get 413 before any decoding."""
    max_image_work_bytes: int = Field(512 << 20, ge=1 << 20, le=1 << 36)
    """What decoding and resizing one image may hold at its peak, planned from its header
    (decoded pixels, the decoder's buffers, the resize's intermediate and output): an image
    whose plan needs more gets 413 before any decoding."""
    default_top_k: int = Field(5, ge=1, le=64)
    """``top_k`` when the request gives none."""
    request_timeout_s: float = Field(60.0, gt=0.0, le=3600.0)
    """A request that has no answer after this gets 504."""
    upload_grace_s: float = Field(1.0, gt=0.0, le=60.0)
    """A request body complete this soon after the request reaches the replica (nearly
    every body) is read without an upload slot; one still arriving needs a slot."""
    max_concurrent_uploads: int = Field(128, ge=1, le=100_000)
    """Slow request bodies (past ``upload_grace_s``) one ingress replica reads at once; a
    request beyond that gets 503 with ``Retry-After`` at once. Capped at three quarters of
    ``ingress_deployment.max_ongoing_requests``, so stalled uploads never take every slot
    (health and requests whose bodies come keep the rest)."""
    body_idle_timeout_s: float = Field(5.0, gt=0.0, le=600.0)
    """A request body that makes no progress for this long gets 408 and the connection
    closes."""
    body_timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    """A request body not complete this long after its first read gets 408."""


class PreprocessConfig(_Strict):
    """Decoding and resizing."""

    threads: int = Field(4, ge=1, le=256)
    """Worker threads per replica for decode + resize (simplejpeg and Pillow release the GIL)."""
    device: Literal["cpu", "gpu"] = "cpu"
    """``gpu``: decode (see ``decoder``) and resize on a GPU. In a PreprocessGPU deployment of
    its own (``preprocess_deployment.num_gpus`` > 0), which hands the batch to the inference
    replica over ``transport.preprocess_to_inference``; or, with
    ``fusion.preprocess_in_inference``, on the inference replica's own GPU."""
    decoder: Literal["auto", "cpu", "nvimgcodec"] = "auto"
    """JPEG decoding where ``device`` is ``gpu``: ``nvimgcodec`` decodes on the GPU
    (nvJPEG; the ``gpu-decode`` extra), ``cpu`` on worker threads (simplejpeg), ``auto``
    the GPU when nvImageCodec loads. PNG is always decoded on the CPU."""
    gpu_decode_backend: Literal["auto", "hardware", "cuda", "hybrid"] = "auto"
    """Which nvJPEG backend nvImageCodec prefers: the hardware engines (A100/H100/H200),
    CUDA kernels, or hybrid (Huffman on the CPU); ``auto`` lets it choose per image."""


class TransportConfig(_Strict):
    """How tensors move between GPU stages."""

    preprocess_to_inference: Literal["auto", "nccl", "object_store"] = "auto"
    """The GPU preprocess -> inference hop: ``auto`` is NCCL when both ends hold CUDA devices
    and NCCL loads, the object store otherwise."""
    timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    """Deadline of each transfer; past it the NCCL link is aborted (``TransportError``) and
    rebuilt on next use."""
    staging_slots: int = Field(4, ge=1, le=64)
    """Pinned buffers the GPU preprocess stage uploads decoded images through."""
    staging_slot_bytes: int = Field(64 << 20, ge=1 << 20, le=4 << 30)
    """Size of each; a call whose decoded images do not fit is uploaded in parts."""


class FusionConfig(_Strict):
    """Stages that run inside a neighbour instead of a deployment of their own. Each saves
    one Serve hop per coalesced call -- a hop costs CPU in the caller, the callee and Serve's
    router, and on a GPU node the CPUs run out in the hops before the GPU is busy."""

    preprocess_in_ingress: bool = False
    """Decode and resize in the ingress replicas' thread pools (``preprocess.threads`` each);
    no Preprocess deployment. Scale ``ingress_deployment`` for the decode work instead."""
    postprocess_in_inference: bool = False
    """Softmax, top-k and the answers in the inference replica (a worker thread); no
    Postprocess deployment."""
    preprocess_in_inference: bool = False
    """Decode and resize in the inference replica: on its GPU with ``preprocess.device: gpu``
    (JPEGs decoded by nvImageCodec, the batch never leaves the device), on its threads
    otherwise. No Preprocess deployment; the ingress sends the encoded bytes."""
    inference_in_ingress: bool = False
    """The whole pipeline in each ingress replica: it parses HTTP, decodes, runs the model
    and answers, with no Serve hop at all (needs ``preprocess_in_inference`` and
    ``postprocess_in_inference``). ``ingress_deployment`` then sizes the one deployment,
    GPU share included; ``inference_deployment`` is not used. Each replica's one GIL then
    carries HTTP and inference both."""


class PipelineConfig(_Strict):
    """A whole Ferry application: models, executor, batching and the four stages."""

    models: list[ModelConfig] = Field(
        default_factory=lambda: [
            ModelConfig(name="digits", source="digits"),
            ModelConfig(name="resnet50", source="resnet50"),
        ]
    )
    """Models served; each is loaded into every inference replica."""
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    """The GPU actor's core: device, pool, streams, buckets, CUDA graphs."""
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    """How the inference stage forms GPU batches."""
    ingress: IngressConfig = Field(default_factory=IngressConfig)
    """The HTTP front: coalescing, body and pixel limits, timeouts."""
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    """Decoding and resizing: where, with what, on how many threads."""
    transport: TransportConfig = Field(default_factory=TransportConfig)
    """How tensors move between GPU stages (NCCL or the object store)."""
    fusion: FusionConfig = Field(default_factory=FusionConfig)
    """Stages run inside a neighbour instead of a deployment of their own."""
    ingress_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the ingress (of the one deployment with ``fusion.inference_in_ingress``)."""
    preprocess_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the Preprocess (or PreprocessGPU) deployment, where there is one."""
    inference_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the Inference deployment (the GPU actor), where there is one."""
    postprocess_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the Postprocess deployment, where there is one."""
    gpus: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = "auto"
    """GPUs the deployments with ``replicas_per_gpu`` spread over; ``auto``: all the cluster's
    GPUs when the application is built. Unused by deployments that give ``num_replicas``."""
    warmup: bool = True
    """Plan every bucket (and capture its CUDA graph) before the inference replica reports healthy."""
    access_log: bool | None = None
    """Serve's per-request access log (a line per request, with its request id) in every
    replica; it costs CPU at high rates. ``None``: as Serve's ``logging_config`` says."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = None
    """Log level of Ferry's deployments. ``None``: as Serve's ``logging_config`` says."""
    log_encoding: Literal["TEXT", "JSON"] | None = None
    """Serve's log encoding in Ferry's deployments (JSON: one object a line, request id,
    deployment and replica as fields). ``None``: as Serve's ``logging_config`` says.

    When none of ``access_log``, ``log_level`` and ``log_encoding`` is set, Ferry gives its
    deployments no ``logging_config`` and Serve's own applies (the config file's
    application- or top-level ``logging_config``, else Serve's defaults). When any is set,
    the three form the deployments' ``logging_config``, the unset ones defaulting to no
    access log, INFO and TEXT."""

    def serve_logging_config(self) -> dict[str, Any] | None:
        """The deployments' ``logging_config``, or None to leave Serve's in force."""
        if self.access_log is None and self.log_level is None and self.log_encoding is None:
            return None
        return {
            "enable_access_log": bool(self.access_log),
            "log_level": self.log_level or "INFO",
            "encoding": self.log_encoding or "TEXT",
        }

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if not self.models:
            raise ValueError("at least one model is required")
        mb = self.batching.max_batch_size
        for m in self.models:
            if m.max_batch is not None and m.max_batch < self.executor.buckets[0]:
                raise ValueError(
                    f"model {m.name!r}: max_batch {m.max_batch} is below the smallest bucket "
                    f"{self.executor.buckets[0]}"
                )
            if m.input.resize == "fit" and self.preprocess.device == "gpu":
                raise ValueError(
                    f"model {m.name!r}: input.resize 'fit' runs on the CPU image path only; "
                    "use crop or stretch with preprocess.device 'gpu'"
                )
        if mb > self.executor.buckets[-1]:
            raise ValueError(
                f"batching.max_batch_size ({mb}) exceeds the largest bucket ({self.executor.buckets[-1]})"
            )
        from .placement import check_pools

        check_pools(self)  # the pools of replicas sharing a GPU fit it together
        fu = self.fusion
        if fu.preprocess_in_ingress and fu.preprocess_in_inference:
            raise ValueError(
                "fusion.preprocess_in_ingress and fusion.preprocess_in_inference exclude each other"
            )
        if self.preprocess.device == "gpu" and fu.preprocess_in_ingress:
            raise ValueError(
                "fusion.preprocess_in_ingress and preprocess.device 'gpu' exclude each other"
            )
        gpu_pre = self.preprocess.device == "gpu"
        if (
            gpu_pre
            and fu.preprocess_in_inference
            and not fu.inference_in_ingress  # then the ingress holds the GPU share
            and not self.inference_deployment.holds_gpu
        ):
            raise ValueError(
                "preprocess.device is 'gpu' with fusion.preprocess_in_inference but "
                f"inference_deployment.num_gpus is {self.inference_deployment.num_gpus}"
            )
        if gpu_pre and not fu.preprocess_in_inference and not self.preprocess_deployment.holds_gpu:
            raise ValueError(
                "preprocess.device is 'gpu' but preprocess_deployment.num_gpus is "
                f"{self.preprocess_deployment.num_gpus}; give it a GPU share"
            )
        if fu.inference_in_ingress:
            if not (fu.preprocess_in_inference and fu.postprocess_in_inference):
                raise ValueError(
                    "fusion.inference_in_ingress needs fusion.preprocess_in_inference and "
                    "fusion.postprocess_in_inference: the whole pipeline in one process"
                )
            if gpu_pre and not self.ingress_deployment.holds_gpu:
                raise ValueError(
                    "preprocess.device is 'gpu' with fusion.inference_in_ingress but "
                    f"ingress_deployment.num_gpus is {self.ingress_deployment.num_gpus}"
                )
            return self
        ongoing = self.inference_deployment.max_ongoing_requests
        if ongoing < mb // max(1, self.ingress.max_coalesce):
            raise ValueError(
                f"inference_deployment.max_ongoing_requests ({ongoing}) is too small to fill a batch of "
                f"{mb} with calls of up to {self.ingress.max_coalesce} items"
            )
        return self


@dataclass(frozen=True)
class Settings:
    """Process-level switches from the environment -- the only place that reads it."""

    backend: str | None  # FERRY_BACKEND: forces "cupy" or "numpy" where a config says "auto"
    auth_token: str | None  # FERRY_AUTH_TOKEN: the ingress's bearer token

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            backend=os.environ.get("FERRY_BACKEND") or None,
            auth_token=os.environ.get("FERRY_AUTH_TOKEN") or None,
        )
