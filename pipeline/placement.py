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

Pure functions over plain data: no Ray here (the caller describes the cluster as a
``Cluster``; ``pipeline.check.check`` runs both steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import PipelineConfig


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


@dataclass(frozen=True)
class Cluster:
    """What is known of the cluster a config is deployed on: its live nodes (then its GPUs
    are theirs), or only a GPU count (``ferry config check --gpus N``: the nodes unknown,
    their fit not checked)."""

    gpus: float | None = None
    """The cluster's GPUs (``gpus: auto`` resolves to them); ``None``: unknown."""
    nodes: tuple[NodeShape, ...] = ()
    """The live nodes; empty: not known, so a layout's fit is not checked."""

    @classmethod
    def of(cls, nodes: list[NodeShape]) -> Cluster:
        """The cluster these nodes make (no node: nothing known)."""
        return cls(sum(n.gpus for n in nodes) if nodes else None, tuple(nodes))

    @classmethod
    def from_ray(cls, nodes: list[dict[str, Any]]) -> Cluster:
        """The cluster of ``ray.nodes()``'s live nodes."""
        return cls.of([NodeShape.from_ray(n) for n in nodes if n.get("Alive")])


def resolve(config: PipelineConfig, cluster_gpus: float | None) -> PipelineConfig:
    """``config`` with every ``replicas_per_gpu`` turned into ``num_replicas`` and ``num_gpus``.

    ``cluster_gpus`` is what the cluster has (``None``: unknown, not connected); it is used
    where ``config.gpus`` is ``"auto"``. A config without ``replicas_per_gpu`` comes back as it is.
    """
    per_gpu = [(s, d) for s, d in config.gpu_stages() if d.replicas_per_gpu is not None]
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


def check_fits(config: PipelineConfig, nodes: list[NodeShape]) -> list[str]:
    """Refuse (``ValueError``) a resolved layout that the cluster's nodes cannot hold; returns
    notes on what could not be checked (no GPU node up yet: an autoscaling cluster)."""
    gpu_nodes = [n for n in nodes if n.gpus > 0]
    notes: list[str] = []
    stages = config.gpu_stages()
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
    used = [getattr(config, f"{s}_deployment") for s in config.deployed_stages()]
    all_cpus = sum((d.num_replicas or 0) * d.num_cpus for d in used)
    if all_cpus > sum(n.cpus for n in nodes) + 1e-9:
        raise ValueError(
            f"the deployments need {all_cpus:g} CPUs in all; the cluster has "
            f"{sum(n.cpus for n in nodes):g}"
        )
    return notes
