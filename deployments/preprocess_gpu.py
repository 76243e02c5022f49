"""PreprocessGPU: the Serve deployment of the GPU preprocess stage
(``pipeline.stages.preprocess_gpu``), in the ``gpu_preprocess`` placement.

The inference replica drives it: it calls it with its own endpoint in ``to``, so the sender
knows whom to send to (a Serve handle picks the replica, so the receiving end has to say who
it is); the rows that come back carry the batch's envelope (NCCL or the object store).
"""

from __future__ import annotations

from pipeline.stages.preprocess_gpu import PreprocessGpuStage

from .replica import stage_deployment

PreprocessGPU = stage_deployment("PreprocessGPU", "preprocess_deployment", PreprocessGpuStage)
