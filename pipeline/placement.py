"""Where the GPU deployments' replicas go: GPU counts turned into replica counts and GPU shares,
and the checks that a layout fits the cluster it is about to be deployed on.

A deployment that holds a GPU share can say ``replicas_per_gpu: k`` instead of a replica count
and a fraction. ``PipelineConfig.gpus`` (a number, or ``"auto"``: the GPUs the cluster has when
the application is built) then makes it ``k x gpus`` replicas of ``1/k`` GPU each, so one config
serves a node of one GPU and a node of eight unchanged. The memory pools of the replicas that
share one GPU must fit it together (``executor.pool_limit_fraction`` x replicas on a GPU <=
0.95); ``PipelineConfig`` checks that itself. What only the cluster can tell -- whether each GPU
node has the cores for the replicas its GPUs take -- ``check_fits`` checks against the nodes
``ray.nodes()`` reports, before Serve is asked to place anything (Serve would otherwise leave
the replicas pending without a word).

Pure functions over plain data: no Ray here (``deployments/app.py`` passes the nodes in).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import DeploymentOptions, PipelineConfig

POOL_SHARE_LIMIT = 0.95  # of one GPU's memory, for the pools of all replicas sharing it
STAGES = ("ingress", "preprocess", "inference", "postprocess")


@dataclass(frozen=True)
class NodeShape:
    """What a node of the cluster offers (from ``ray.nodes()``'s resources)."""

    node_id: str
    cpus: float
    gpus: float

    @classmethod
    def from_ray(cls, node: dict[str, Any]) -> NodeShape:
        res = node.get("Resources") or {}
        return cls(str(node.get("NodeID", "?")), float(res.get("CPU", 0)), float(res.get("GPU", 0)))


def replicas_sharing_a_gpu(num_gpus: float) -> int:
    """How many replicas of ``num_gpus`` each Ray packs onto one device (0 for no GPU)."""
    if num_gpus <= 0:
        return 0
    if num_gpus >= 1:
        return 1
    return math.floor(1 / num_gpus + 1e-9)


def gpu_stages(config: PipelineConfig) -> list[tuple[str, DeploymentOptions]]:
    """The deployments that are really deployed and hold a GPU share (or ask for one per GPU)."""
    out = []
    for stage in used_stages(config):
        d = getattr(config, f"{stage}_deployment")
        if d.num_gpus > 0 or d.replicas_per_gpu is not None:
            out.append((stage, d))
    return out


def used_stages(config: PipelineConfig) -> list[str]:
    """The stages that run as deployments of their own in this config's form."""
    return list(config.form.deployments)


def resolve(config: PipelineConfig, cluster_gpus: float | None) -> PipelineConfig:
    """``config`` with every ``replicas_per_gpu`` turned into ``num_replicas`` and ``num_gpus``.

    ``cluster_gpus`` is what the cluster has (``None``: unknown, not connected); it is used
    where ``config.gpus`` is ``"auto"``. A config without ``replicas_per_gpu`` comes back as it is.
    """
    per_gpu = [(s, d) for s, d in gpu_stages(config) if d.replicas_per_gpu is not None]
    if not per_gpu:
        return config
    gpus = config.gpus
    if gpus == "auto":
        if not cluster_gpus or cluster_gpus < 1:
            raise ValueError(
                f"gpus is 'auto' but the cluster reports {cluster_gpus or 0} GPUs; start the "
                "GPU nodes first or give gpus as a number"
            )
        gpus = int(cluster_gpus)
    changes: dict[str, Any] = {}
    for stage, d in per_gpu:
        k = d.replicas_per_gpu
        changes[f"{stage}_deployment"] = d.model_copy(
            update={
                "num_replicas": k * gpus,
                "num_gpus": round(1.0 / k, 6),
                "replicas_per_gpu": None,
            }
        )
    data = config.model_dump()
    for key, opts in changes.items():
        data[key] = opts.model_dump()
    data["gpus"] = gpus
    return type(config).model_validate(data)


def check_pools(config: PipelineConfig) -> None:
    """Refuse GPU shares whose memory pools cannot fit one device together."""
    frac = config.executor.pool_limit_fraction
    if config.executor.pool_limit_bytes is not None:
        return  # an absolute limit: the device's size is known only on the node
    for stage, d in gpu_stages(config):
        if stage not in (config.form.executor_in, "preprocess"):
            continue  # the stage that owns the executor has a pool, and PreprocessGPU one
        k = d.replicas_per_gpu or replicas_sharing_a_gpu(d.num_gpus)
        if k * frac > POOL_SHARE_LIMIT + 1e-9:
            raise ValueError(
                f"{stage}_deployment puts {k} replicas on one GPU, each with a pool of "
                f"executor.pool_limit_fraction {frac}: {k * frac:.3f} of the device's memory "
                f"(at most {POOL_SHARE_LIMIT}); lower pool_limit_fraction to "
                f"{math.floor(POOL_SHARE_LIMIT / k * 1000) / 1000} or fewer replicas per GPU"
            )


def check_fits(config: PipelineConfig, nodes: list[NodeShape]) -> list[str]:
    """Refuse (``ValueError``) a resolved layout that the cluster's nodes cannot hold; returns
    notes on what could not be checked (no GPU node up yet: an autoscaling cluster)."""
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    notes: list[str] = []
    stages = gpu_stages(config)
    if not stages:
        return notes
    if not gpu_nodes:
        return [
            "no GPU node is up: replica placement is not checked (an autoscaling cluster "
            "starts GPU nodes when the replicas ask for them)"
        ]
    total_gpus = sum(n.gpus for n in gpu_nodes)
    for stage, d in stages:
        need = (d.num_replicas or 0) * d.num_gpus
        if need > total_gpus + 1e-9:
            raise ValueError(
                f"{stage}_deployment asks for {d.num_replicas} replicas of {d.num_gpus} GPU "
                f"({need:g} GPUs); the cluster has {total_gpus:g}"
            )
    # cores: the GPU stages' replicas run on the GPU nodes, so those nodes' CPUs must hold
    # them; every stage's replicas together must fit the whole cluster's CPUs
    gpu_cpus = sum((d.num_replicas or 0) * d.num_cpus for _, d in stages)
    have = sum(n.cpus for n in gpu_nodes)
    if gpu_cpus > have + 1e-9:
        parts = " + ".join(f"{d.num_replicas} {s} x {d.num_cpus}" for s, d in stages)
        raise ValueError(
            f"the GPU deployments need {parts} = {gpu_cpus:g} CPUs on the GPU nodes, which "
            f"have {have:g}; lower num_cpus or replicas per GPU"
        )
    used = [getattr(config, f"{s}_deployment") for s in used_stages(config)]
    all_cpus = sum((d.num_replicas or 0) * d.num_cpus for d in used)
    if all_cpus > sum(n.cpus for n in nodes) + 1e-9:
        raise ValueError(
            f"the deployments need {all_cpus:g} CPUs in all; the cluster has "
            f"{sum(n.cpus for n in nodes):g}"
        )
    return notes
