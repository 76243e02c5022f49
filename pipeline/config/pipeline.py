"""A whole Ferry application (``PipelineConfig``: its sections and the cross-field rules that
tie them) and the process-level switches read from the environment (``Settings``)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from .base import Strict
from .deployment import DeploymentOptions
from .health import HealthConfig
from .models import ModelBatch, ModelConfig
from .placements import PLACEMENTS, Placement, PlacementName
from .runtime import BatchingConfig, ExecutorConfig
from .stages import IngressConfig, PreprocessConfig, StreamsConfig, TransportConfig

POOL_SHARE_LIMIT = 0.95  # of one GPU's memory, for the pools of all replicas sharing it


class PipelineConfig(Strict):
    """A whole Ferry application: its placement, models, executor, batching and stages."""

    removed: ClassVar[dict[str, str]] = {
        "fusion": "placement replaced it (four_stage, one_process, split or gpu_preprocess; "
        "README, Placements)",
        "warmup": "replicas always warm up before they report ready; delete it",
    }

    placement: PlacementName = "four_stage"
    """Where the stages run, one named row of ``pipeline.config.placements.PLACEMENTS``: ``four_stage``
    (ingress, CPU preprocess, inference, postprocess: the CPU default), ``one_process`` (the
    whole pipeline in each ingress replica: the GPU default), ``split`` (ingress on CPU nodes,
    one hop to inference replicas that decode and answer), ``gpu_preprocess`` (decoding on a
    GPU of its own, batches to the inference GPU over NCCL)."""

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
    streams: StreamsConfig = Field(default_factory=StreamsConfig)
    """Live video streams over WebSocket: admission, rates, deadlines, slow readers."""
    preprocess: PreprocessConfig = Field(default_factory=PreprocessConfig)
    """Decoding and resizing: with what, on how many threads."""
    transport: TransportConfig = Field(default_factory=TransportConfig)
    """How batches move from PreprocessGPU to inference (``gpu_preprocess``)."""
    ingress_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the ingress (in ``one_process`` the one deployment, GPU share included)."""
    preprocess_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the Preprocess (or PreprocessGPU) deployment, where there is one."""
    inference_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the Inference deployment (the GPU actor), where there is one."""
    postprocess_deployment: DeploymentOptions = Field(default_factory=DeploymentOptions)
    """Serve options of the Postprocess deployment, where there is one."""
    gpus: Annotated[int, Field(ge=1, le=4096)] | Literal["auto"] = "auto"
    """GPUs the deployments with ``replicas_per_gpu`` spread over; ``auto``: all the cluster's
    GPUs when the application is built. Unused by deployments that give ``num_replicas``."""
    health: HealthConfig = Field(default_factory=HealthConfig)
    """What makes a replica that owns an executor fail its health check (pipeline/health.py)."""
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

    @property
    def placement_row(self) -> Placement:
        """The row of ``PLACEMENTS`` this config's placement names."""
        return PLACEMENTS[self.placement]

    @property
    def decodes_on_gpu(self) -> bool:
        """Whether images are decoded and resized on a GPU: in a PreprocessGPU deployment, or
        in the process that owns the executor when that holds a GPU share."""
        row = self.placement_row
        if row.decode_in == "preprocess_gpu":
            return True
        owner = getattr(self, f"{row.executor_in}_deployment")
        return row.decode_in == "executor" and owner.holds_gpu

    def batch_of(self, model: str) -> ModelBatch:
        """``model``'s batch sizes (``ModelBatch``): what the executor, the scheduler,
        ``/v2/models/{m}/config`` and ``ferry models`` all read."""
        for m in self.models:
            if m.name == model:
                return m.batch(self.executor.buckets)
        raise KeyError(model)

    @property
    def request_rows(self) -> int:
        """Most rows one v2 request may carry (``ingress.max_request_rows``)."""
        rows = self.ingress.max_request_rows
        return self.batching.max_queue if rows is None else rows

    @property
    def largest_batch(self) -> int:
        """The largest ``max_batch`` of the models: the most rows one batch of any holds."""
        return max(m.batch(self.executor.buckets).max_batch for m in self.models)

    def deployed_stages(self) -> list[str]:
        """The stages that run as deployments of their own in this config's placement."""
        return list(self.placement_row.deployments)

    def gpu_stages(self) -> list[tuple[str, DeploymentOptions]]:
        """The deployed stages that hold a GPU share (or ask for one per GPU), with their
        options."""
        out = []
        for stage in self.deployed_stages():
            d = getattr(self, f"{stage}_deployment")
            if d.num_gpus > 0 or d.replicas_per_gpu is not None:
                out.append((stage, d))
        return out

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
        self._models_and_batches()
        self._budgets_cover_the_queues()
        self._pools_fit_a_gpu()
        self._placement_rules()
        return self

    def _models_and_batches(self) -> None:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if not self.models:
            raise ValueError("at least one model is required")
        if unknown := sorted(set(self.batching.model_queue_policy) - set(names)):
            raise ValueError(f"batching.model_queue_policy names unknown models {unknown}")
        for m in self.models:
            base = m.buckets or self.executor.buckets
            if m.max_batch is not None and m.max_batch < base[0]:
                raise ValueError(
                    f"model {m.name!r}: max_batch {m.max_batch} is below the smallest bucket "
                    f"{base[0]}"
                )
        if self.request_rows > self.batching.max_queue:
            raise ValueError(
                f"ingress.max_request_rows ({self.request_rows}) exceeds "
                f"batching.max_queue ({self.batching.max_queue}): such a request could never "
                "be queued whole"
            )

    def _budgets_cover_the_queues(self) -> None:
        # one budget for both queues: under load a request waits a window in the ingress's
        # coalescer and up to max_wait_ms for its GPU batch to fill
        window, fill = self.ingress.coalesce_window_ms, self.batching.max_wait_ms
        for where, timeout_ms in self.batching.budgets().items():
            if timeout_ms <= window + fill:
                raise ValueError(
                    f"batching.{where}.timeout_ms ({timeout_ms}) must exceed "
                    f"ingress.coalesce_window_ms ({window}) + batching.max_wait_ms ({fill}): "
                    "under load a request waits that long in the ingress's coalescer and for "
                    "its batch, and past its budget it is dropped with 503"
                )

    def _placement_rules(self) -> None:
        row = self.placement_row
        if self.decodes_on_gpu:
            for m in self.models:
                if m.input.resize == "fit":
                    raise ValueError(
                        f"model {m.name!r}: input.resize 'fit' runs on the CPU image path only; "
                        f"placement {self.placement!r} decodes on a GPU here: use crop or stretch"
                    )
        if row.decode_in == "preprocess_gpu" and not self.preprocess_deployment.holds_gpu:
            raise ValueError(
                "placement 'gpu_preprocess' decodes on a GPU but preprocess_deployment.num_gpus "
                f"is {self.preprocess_deployment.num_gpus}; give it a GPU share"
            )
        if row.executor_in == "ingress":
            return  # no call leaves the ingress replica: nothing more to size
        ongoing, mb = self.inference_deployment.max_ongoing_requests, self.largest_batch
        if ongoing < mb // max(1, self.ingress.max_coalesce):
            raise ValueError(
                f"inference_deployment.max_ongoing_requests ({ongoing}) is too small to fill a batch of "
                f"{mb} with calls of up to {self.ingress.max_coalesce} items"
            )

    def _pools_fit_a_gpu(self) -> None:
        """Refuse GPU shares whose memory pools cannot fit one device together."""
        frac = self.executor.pool_limit_fraction
        if self.executor.pool_limit_bytes is not None:
            return  # an absolute limit: the device's size is known only on the node
        for stage, d in self.gpu_stages():
            if stage not in (self.placement_row.executor_in, "preprocess"):
                continue  # the stage that owns the executor has a pool, and PreprocessGPU one
            k = d.replicas_on_a_gpu
            if k * frac > POOL_SHARE_LIMIT + 1e-9:
                raise ValueError(
                    f"{stage}_deployment puts {k} replicas on one GPU, each with a pool of "
                    f"executor.pool_limit_fraction {frac}: {k * frac:.3f} of the device's "
                    f"memory (at most {POOL_SHARE_LIMIT}); lower pool_limit_fraction to "
                    f"{math.floor(POOL_SHARE_LIMIT / k * 1000) / 1000} or fewer replicas per GPU"
                )


@dataclass(frozen=True)
class Settings:
    """Process-level switches from the environment -- the only place that reads it."""

    backend: str | None  # FERRY_BACKEND: forces "cupy" or "numpy" where a config says "auto"
    auth_token: str | None  # FERRY_AUTH_TOKEN: the ingress's bearer token
    faults: str | None = None  # FERRY_FAULTS: injected faults as JSON (pipeline/faults.py)

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            backend=os.environ.get("FERRY_BACKEND") or None,
            auth_token=os.environ.get("FERRY_AUTH_TOKEN") or None,
            faults=os.environ.get("FERRY_FAULTS") or None,
        )
