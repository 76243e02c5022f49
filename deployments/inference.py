"""Inference: the Serve deployment of the inference stage (``pipeline.stages.inference``),
in every placement but ``one_process`` (there the ingress replica runs the stage itself).

``logits(model, rows, meta, feed)`` runs decoded images or v2 tensors; ``answers(model,
rows, meta, specs, feed)`` answers them too; ``encoded(model, items, meta, specs)`` decodes
checked image bytes here (or through PreprocessGPU) and answers. The ingresses of its own
node send ``encoded`` and ``answers`` over a Unix socket instead (``local_hop.py``). What
the replica is given -- a decoder, an answerer, a PreprocessGPU handle -- is the composition
root's choice (``deployments/app.py``), passed as this deployment's arguments.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import PipelineConfig
from pipeline.stages.build import build_inference
from pipeline.stages.inference import InferenceStage
from pipeline.stages.messages import SendTo

from . import load_board, local_hop
from .replica import stage_deployment


def inference_replica(
    config: PipelineConfig,
    decode_here: bool = False,
    answer_here: bool = False,
    preprocess: Any = None,
) -> InferenceStage:
    """The stage of one replica; with a PreprocessGPU handle, its batches come from there.
    Each step of loading its models is published for the ingress (``load_board``)."""
    fetch = None
    if preprocess is not None:

        async def fetch(model: str, items: list, to: SendTo) -> Any:
            return await preprocess.remote(model, items, to)

    board = load_board.for_this_replica(config)
    stage = build_inference(
        config,
        decode_here=decode_here,
        answer_here=answer_here,
        fetch=fetch,
        progress=board.publish if board is not None else None,
    )
    local_hop.serve_stage(stage, config)  # the ingresses of this node call it over a socket
    return stage


Inference = stage_deployment(
    "Inference",
    "inference_deployment",
    inference_replica,
    methods=("logits", "answers", "encoded", "status", "signatures"),
    stamps_hops=("answers", "encoded"),
    call=False,
)
