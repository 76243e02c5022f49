"""The placements Ferry is deployed in: one named form, chosen by ``PipelineConfig.placement``.

Each form is a row of ``FORMS``: the stages that run as Serve deployments of their own (the
ingress first), the stage whose process owns the executor (the GPU), where images are
decoded and resized, and when the form is the right one. ``deployments/app.py`` binds the
deployments of a row; ``pipeline.placement`` places their replicas; the ingress picks its
way downstream (a Serve hop or a direct call) from the same row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Placement = Literal["four_stage", "one_process", "split", "gpu_preprocess"]


@dataclass(frozen=True)
class Form:
    """One placement: which stages are deployments, and where the work runs."""

    deployments: tuple[str, ...]
    """The stages deployed as Serve deployments of their own, ingress first."""
    executor_in: Literal["ingress", "inference"]
    """The stage whose replicas own the executor (and the GPU share, on a GPU node)."""
    decode_in: Literal["preprocess", "executor", "preprocess_gpu"]
    """``preprocess``: a CPU Preprocess deployment; ``executor``: the process that owns the
    executor, on its GPU when it has one (nvImageCodec, one resize launch), on its threads
    otherwise; ``preprocess_gpu``: a PreprocessGPU deployment on a GPU of its own, whose
    batches reach the inference replica over NCCL (the object store where NCCL does not load)."""
    when: str
    """When to use it (README's placement table says the same)."""


FORMS: dict[str, Form] = {
    "four_stage": Form(
        ("ingress", "preprocess", "inference", "postprocess"),
        "inference",
        "preprocess",
        "The embedded CPU default (serve_config.yaml), and wherever decode, model and "
        "answers must scale apart: each stage its own replica count and CPU share.",
    ),
    "one_process": Form(
        ("ingress",),
        "ingress",
        "executor",
        "A GPU node (serve_config.gpu.yaml, the shipped GPU default): each replica runs the "
        "whole pipeline on its GPU share, with no Serve hop -- the fastest form measured "
        "(benchmarks/RESULTS.md, bench_e2e: 6,092 img/s on one H200).",
    ),
    "split": Form(
        ("ingress", "inference"),
        "inference",
        "executor",
        "HTTP on CPU nodes and GPU nodes for the model only (ingress_deployment.resources "
        "or label_selector): one Serve hop per coalesced group to inference replicas that "
        "decode on their GPU and answer.",
    ),
    "gpu_preprocess": Form(
        ("ingress", "preprocess", "inference"),
        "inference",
        "preprocess_gpu",
        "A node of several GPUs where decoding needs a GPU of its own (serve_config.gpu2.yaml): "
        "PreprocessGPU decodes and resizes there and sends the batch to the inference "
        "replica's GPU over NCCL (NVLink where there is one).",
    ),
}
