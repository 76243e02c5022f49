"""Inference: the Serve deployment of the inference stage (``pipeline.stages.inference``),
in every placement but ``one_process`` (there the ingress replica runs the stage itself).

``__call__(model, rows, meta, specs, feed)`` runs decoded images or v2 tensors;
``encoded(model, items, meta, specs)`` decodes checked image bytes here (or through
PreprocessGPU) and answers. Given a ``preprocess`` handle (``gpu_preprocess``), the stage
fetches its batches from that deployment.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import PipelineConfig
from pipeline.stages.inference import InferenceStage
from pipeline.stages.messages import SendTo

from . import load_board
from .replica import stage_deployment


def build_inference(config: PipelineConfig, preprocess: Any = None) -> InferenceStage:
    """The stage; with a PreprocessGPU handle, its batches come from there. Each step of
    loading its models is published for the ingress (``load_board``)."""
    fetch = None
    if preprocess is not None:

        async def fetch(model: str, items: list, to: SendTo) -> Any:
            return await preprocess.remote(model, items, to)

    board = load_board.for_this_replica(config)
    return InferenceStage(config, fetch, board.publish if board is not None else None)


Inference = stage_deployment(
    "Inference",
    "inference_deployment",
    build_inference,
    methods=("encoded", "status", "signatures"),
    stamps_hops=("__call__", "encoded"),
)
