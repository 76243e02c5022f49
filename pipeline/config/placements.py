"""The placements Ferry is deployed in: one named row of ``PLACEMENTS``, chosen by
``PipelineConfig.placement``.

A row says which stages run as Serve deployments of their own (the ingress first), which
process owns the executor (the GPU), where images are decoded and resized, which stage
answers, how the ingress reaches the stage below it, and when the row is the right one.
It is data: ``deployments/app.py`` -- the composition root -- is the one reader that turns
it into deployments and tells each what it is given (a way downstream, a decoder, an
answerer); the config's own rules read it to check values (a GPU decoder cannot ``fit``).
No stage or route asks which placement it is in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PlacementName = Literal["four_stage", "one_process", "split", "gpu_preprocess"]
Decode = Literal["preprocess", "executor", "preprocess_gpu"]
WayDown = Literal["chain", "hop", "in_process"]


@dataclass(frozen=True)
class Placement:
    """One placement: which stages are deployments, and where the work runs."""

    deployments: tuple[str, ...]
    """The stages deployed as Serve deployments of their own, ingress first."""
    executor_in: Literal["ingress", "inference"]
    """The stage whose replicas own the executor (and the GPU share, on a GPU node)."""
    decode_in: Decode
    """``preprocess``: a CPU Preprocess deployment; ``executor``: the process that owns the
    executor, on its GPU when it has one (nvImageCodec, one resize launch), on its threads
    otherwise; ``preprocess_gpu``: a PreprocessGPU deployment on a GPU of its own, whose
    batches reach the inference replica over NCCL (the object store where NCCL does not load)."""
    answer_in: Literal["postprocess", "executor"]
    """Where softmax, top-k and the answers are made: a Postprocess deployment, or the process
    that owns the executor (in a worker thread)."""
    way_down: WayDown
    """How the ingress reaches the rest: ``chain`` (Preprocess -> Inference -> Postprocess as
    chained Serve calls), ``hop`` (one Serve call per coalesced group to an inference replica
    that answers), ``in_process`` (the inference stage built in the ingress replica)."""
    when: str
    """When to use it (README's placement table says the same)."""


PLACEMENTS: dict[str, Placement] = {
    "four_stage": Placement(
        ("ingress", "preprocess", "inference", "postprocess"),
        "inference",
        "preprocess",
        "postprocess",
        "chain",
        "The embedded CPU default (serve_config.yaml), and wherever decode, model and "
        "answers must scale apart: each stage its own replica count and CPU share.",
    ),
    "one_process": Placement(
        ("ingress",),
        "ingress",
        "executor",
        "executor",
        "in_process",
        "A GPU node (serve_config.gpu.yaml, the shipped GPU default): each replica runs the "
        "whole pipeline on its GPU share, with no Serve hop -- the fastest placement measured "
        "(benchmarks/RESULTS.md, bench_e2e).",
    ),
    "split": Placement(
        ("ingress", "inference"),
        "inference",
        "executor",
        "executor",
        "hop",
        "HTTP on CPU nodes and GPU nodes for the model only (ingress_deployment.resources "
        "or label_selector): one Serve hop per coalesced group to inference replicas that "
        "decode on their GPU and answer.",
    ),
    "gpu_preprocess": Placement(
        ("ingress", "preprocess", "inference"),
        "inference",
        "preprocess_gpu",
        "executor",
        "hop",
        "A node of several GPUs where decoding needs a GPU of its own (serve_config.gpu2.yaml): "
        "PreprocessGPU decodes and resizes there and sends the batch to the inference "
        "replica's GPU over NCCL (NVLink where there is one).",
    ),
}
