"""Preprocess: the Serve deployment of the decode stage (``pipeline.stages.decode``), in the
``four_stage`` placement."""

from __future__ import annotations

from pipeline.stages.decode import PreprocessStage

from .replica import stage_deployment

Preprocess = stage_deployment("Preprocess", "preprocess_deployment", PreprocessStage)
