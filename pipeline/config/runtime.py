"""The GPU actor's configuration: the executor (device, pool, streams, buckets, graphs) and
the scheduler that forms its batches."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from .base import Strict
from .faults import FaultConfig

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class ExecutorConfig(Strict):
    """The GPU actor's core: device, pool, streams, buckets, graphs."""

    removed: ClassVar[dict[str, str]] = {
        "cuda_graphs": "executor.mode replaced it (real: CUDA graphs; eager: the same path "
        "without them)"
    }

    backend: Literal["auto", "cupy", "numpy"] = "auto"
    """``auto``: cupy when a CUDA device is visible, numpy otherwise."""
    device_id: int = Field(0, ge=0, le=63)
    """CUDA device ordinal (within the devices the process sees)."""
    mode: Literal["real", "eager", "naive"] = "real"
    """``real``: a CUDA graph captured per (bucket, arena) at warm-up and replayed; ``eager``:
    the same path launching kernel by kernel (the graphs' baseline); ``naive``: the baseline
    of the whole contract -- cudaMalloc, synchronous pageable copies, eager compute, cudaFree."""
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
    max_workspace_bytes: int = Field(256 << 20, ge=1 << 16, le=8 << 30)
    """Cap on one op's workspace (im2col columns); larger convolutions run in chunks."""
    staging_timeout_s: float = Field(30.0, gt=0.0, le=3600.0)
    """How long ``prepare`` waits for a free pinned staging slot before ``ResourceExhausted``."""
    dtype: Literal["auto", "float16", "float32"] = "auto"
    """Compute dtype: ``auto`` is float16 on the GPU, float32 on the CPU."""
    host_wait: Literal["auto", "spin", "yield", "sleep"] = "auto"
    """How this process's threads wait for the GPU (the primary context's scheduling flag,
    set before the context starts; ``pipeline/cuda_wait.py``): ``auto`` is CUDA's default
    (spin while the process has fewer contexts than the machine has cores), ``sleep`` blocks
    on an OS primitive (``CU_CTX_SCHED_BLOCKING_SYNC``), freeing the cores that libraries'
    synchronous waits (nvImageCodec's, torch's) would otherwise spin on."""
    batch_wait: Literal["sleep", "spin"] = "sleep"
    """How a thread that waits for one of the executor's batches waits: ``sleep`` (a blocking
    event: the thread sleeps and the driver wakes it, tens of microseconds after the batch
    ends) or ``spin`` (a plain event, waited on as the context's ``host_wait`` says --
    spinning under CUDA's default, as torch's own loop waits: no wake-up, a core busy for
    the whole wait). Measured on an H200 (``models.json`` ``wait_ab``, 2026-12-06): one
    thread, 3 batches in flight, the torch engine at 0.93-1.00x ``torch.compile``'s own loop
    (which spins) with ``spin``, 0.71-0.97x with ``sleep`` -- the wake-up lets the GPU run
    dry between batches. ``spin`` is the engine benchmarks' default (``bench_models``); a
    serving replica keeps ``sleep``: its cores are worth more than a wake-up."""
    arenas: Literal["pooled", "kept"] = "pooled"
    """Where a batch's arena comes from (``real`` and ``eager`` modes): ``pooled`` reserves
    its bucket's arena from the pool in ``prepare`` and gives it back after; ``kept`` lends
    it one of the arenas its model keeps, each sized for the largest bucket, so an arena's
    address -- which its CUDA graph is bound to -- never changes after the warm-up, at the
    cost of ``max_in_flight`` x the largest arena held per model and feed
    (``pipeline/executor_arenas.py``). An experiment (bench_e2e's ``*_kept`` systems)."""
    faults: FaultConfig = Field(default_factory=FaultConfig)
    """Injected faults (tests and chaos runs; none by default; ``FERRY_FAULTS`` wins)."""

    @property
    def cuda_graphs(self) -> bool:
        """Whether CUDA graphs are captured and replayed (``mode: real``)."""
        return self.mode == "real"

    @field_validator("buckets")
    @classmethod
    def _buckets_sorted(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        return checked_buckets(v)


def checked_buckets(v: tuple[int, ...]) -> tuple[int, ...]:
    """Padded batch sizes: not empty, in [1, 4096], strictly increasing."""
    if not v:
        raise ValueError("buckets must not be empty")
    if any(b < 1 or b > 4096 for b in v):
        raise ValueError(f"buckets must lie in [1, 4096], got {v}")
    if list(v) != sorted(set(v)):
        raise ValueError(f"buckets must be strictly increasing, got {v}")
    return tuple(v)


class QueuePolicy(Strict):
    """One model's queue policy, after Triton's ``dynamic_batching.default_queue_policy``
    with ``timeout_action: REJECT`` (the size bound is ``batching.max_queue``, Triton's
    ``max_queue_size``)."""

    timeout_ms: float | None = Field(1000.0, gt=0.0, le=600_000.0)
    """The queue-time budget (Triton's ``default_timeout_microseconds``): how long a request
    may wait from the ingress's queue to the start of its GPU batch. A request predicted to
    wait longer is refused at once with 503 + ``Retry-After``; one that waited past it is
    dropped with 503 before its batch. ``None``: no budget (requests queue up to
    ``batching.max_queue``). Set it to about the latency you accept at full load minus one
    batch's time."""

    @property
    def budget_s(self) -> float | None:
        return None if self.timeout_ms is None else self.timeout_ms / 1e3


class BatchingConfig(Strict):
    """How the inference stage forms GPU batches: full, or the wait ran out. When no batch
    is running the queue leaves at once instead of waiting ``max_wait_ms`` (waiting buys
    nothing then); under load the full-or-timeout rule decides."""

    removed: ClassVar[dict[str, str]] = {
        "dispatch_when_idle": "the GPU stage's queue always leaves at once when no batch "
        "is running (benchmarks/RESULTS.md: 3x img/s at one client, no less at 48); delete it",
        "max_batch_size": "a batch's size is its model's: models[].max_batch, else the "
        "largest of its buckets (models[].buckets, else executor.buckets); delete it",
    }

    max_wait_ms: float = Field(2.0, ge=0.0, le=10_000.0)
    """A batch leaves when it holds its model's ``max_batch`` items, or when its oldest item
    has waited this long."""
    max_queue: int = Field(2048, ge=1, le=1_000_000)
    """Items waiting beyond this are refused at once with ``QueueFull`` (HTTP 503)."""
    retry_after_s: float = Field(1.0, ge=0.0, le=600.0)
    """``Retry-After`` sent with 503 answers."""
    default_deadline_ms: float | None = Field(None, gt=0.0)
    """Deadline given to requests that bring none; ``None``: no deadline."""
    queue_policy: QueuePolicy = Field(default_factory=QueuePolicy)
    """Every model's queue-time budget (``pipeline/queue_budget.py``; Triton's queue policy)."""
    model_queue_policy: dict[str, QueuePolicy] = Field(default_factory=dict)
    """Per-model overrides of ``queue_policy``, by model name."""

    def policy_for(self, model: str) -> QueuePolicy:
        return self.model_queue_policy.get(model, self.queue_policy)

    def budgets(self) -> dict[str, float]:
        """Every queue-time budget set, in ms, by where it is set (``queue_policy``,
        ``model_queue_policy.NAME``); policies without a budget are left out."""
        named = {"queue_policy": self.queue_policy} | {
            f"model_queue_policy.{m}": p for m, p in self.model_queue_policy.items()
        }
        return {w: p.timeout_ms for w, p in named.items() if p.timeout_ms is not None}

    @model_validator(mode="after")
    def _budgets_outlast_the_batch_wait(self) -> BatchingConfig:
        """A budget no longer than ``max_wait_ms`` drops every batch that leaves by its
        wait (a partial batch while another is in flight) with 503 queue_timeout."""
        for where, timeout_ms in self.budgets().items():
            if timeout_ms <= self.max_wait_ms:
                raise ValueError(
                    f"batching.{where}.timeout_ms ({timeout_ms}) must exceed "
                    f"batching.max_wait_ms ({self.max_wait_ms}): a request may wait that long "
                    "for its batch to fill, and past its budget it is dropped"
                )
        return self
