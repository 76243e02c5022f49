"""Ray Serve options of one stage (replicas, CPU and GPU shares, placement constraints)."""

from __future__ import annotations

import gc
import math
import sys
from typing import Any

from pydantic import Field, PositiveInt, model_validator

from .base import Strict

GRPC_LIMIT_ENV = {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str((1 << 31) - 1)}


def replicas_sharing_a_gpu(num_gpus: float) -> int:
    """How many replicas of ``num_gpus`` each Ray packs onto one device (0 for no GPU)."""
    if num_gpus <= 0:
        return 0
    if num_gpus >= 1:
        return 1
    return math.floor(1 / num_gpus + 1e-9)


class DeploymentOptions(Strict):
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
    ``ray.io/node-group``), e.g. ``{ray.io/node-group: cpu}`` for the ingress of the split placement."""
    health_check_period_s: float | None = Field(None, gt=0.0, le=3600.0)
    """How often Serve calls the replica's ``check_health``; ``None``: Serve's 10 s."""
    health_check_timeout_s: float | None = Field(None, gt=0.0, le=3600.0)
    """A health check that takes longer fails; ``None``: Serve's 30 s."""
    graceful_shutdown_timeout_s: float | None = Field(None, ge=0.0, le=3600.0)
    """How long a stopping replica may finish its requests in flight (``serve deploy`` of a
    changed config, ``serve shutdown``); ``None``: Serve's 20 s."""
    graceful_shutdown_wait_loop_s: float | None = Field(None, gt=0.0, le=60.0)
    """How often a stopping replica looks whether its requests in flight are done (it waits
    this long before the first look); ``None``: Serve's 2 s, so every stop takes 2 s at least."""
    max_constructor_retry_count: int | None = Field(None, ge=1, le=1000)
    """How many replica starts Serve tries before the deployment is ``DEPLOY_FAILED``
    (Serve counts ``min(this, 3 x num_replicas)``); ``None``: Serve's 20, so 3 tries for one
    replica. A model refused at load is refused again on every try."""
    switch_interval_ms: float | None = Field(None, gt=0.0, le=100.0)
    """Python's GIL switch interval in the replica processes (``sys.setswitchinterval``);
    ``None`` keeps Python's 5 ms. A replica whose worker threads keep the GIL busy makes its
    event loop -- where Serve takes calls and hands back answers -- wait up to this long
    each time it wants the GIL back; a shorter interval trades some CPU for that wait."""
    gc_threshold: tuple[PositiveInt, PositiveInt, PositiveInt] | None = (10_000, 10, 10)
    """The garbage collector's thresholds in the replica processes (``gc.set_threshold``:
    net allocations before a young collection, then young collections before each older
    one); ``None`` keeps Python's (700, 10, 10). At Python's, a replica answering 1,600
    requests a second ran 235 collections a second, about 6% of its CPU; at (10000, 10, 10)
    its CPU per request was 0.93x (``profile_pipeline.json``, experiment ``gc_threshold``).
    What reference counting frees -- nearly all a request makes -- never waits for a
    collection either way; cyclic garbage waits for at most 10,000 more allocations."""

    @property
    def holds_gpu(self) -> bool:
        """A GPU share, given or to come from ``replicas_per_gpu``."""
        return self.num_gpus > 0 or self.replicas_per_gpu is not None

    @property
    def replicas_on_a_gpu(self) -> int:
        """How many of this stage's replicas share one GPU (0: it holds none)."""
        return self.replicas_per_gpu or replicas_sharing_a_gpu(self.num_gpus)

    def apply_in_process(self) -> None:
        """What of these options acts inside the replica process: called by each stage's
        replica as it starts."""
        if self.switch_interval_ms is not None:
            sys.setswitchinterval(self.switch_interval_ms / 1e3)
        if self.gc_threshold is not None:
            gc.set_threshold(*self.gc_threshold)

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
        for k in (
            "health_check_period_s",
            "health_check_timeout_s",
            "graceful_shutdown_timeout_s",
            "graceful_shutdown_wait_loop_s",
            "max_constructor_retry_count",
        ):
            if getattr(self, k) is not None:
                opts[k] = getattr(self, k)
        if self.autoscaling_config is not None:
            opts["autoscaling_config"] = self.autoscaling_config
        else:
            opts["num_replicas"] = self.num_replicas
        return opts
