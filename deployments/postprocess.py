"""Postprocess: the Serve deployment of the postprocess stage
(``pipeline.stages.postprocess``), in the ``four_stage`` placement."""

from __future__ import annotations

from pipeline.stages.postprocess import PostprocessStage

from .replica import stage_deployment

Postprocess = stage_deployment("Postprocess", "postprocess_deployment", PostprocessStage)
