"""Assembling a stage core with its collaborators, in the process it runs in: the inference
stage's executor (its models loaded and warmed), its decoder, its answerer and its link to
PreprocessGPU. The composition root (``deployments/app.py``) says which it gets; this module
only builds what it is told to.
"""

from __future__ import annotations

from collections.abc import Callable

from pipeline.config import PipelineConfig
from pipeline.executor import GpuExecutor
from pipeline.models.loading import LoadReport, load_models, refuse_start
from pipeline.tasks.encode_device import DeviceAnswers

from .decode import PreprocessStage
from .inference import Decoder, Fetch, InferenceStage
from .inference_in import BatchReceiver
from .postprocess import PostprocessStage
from .preprocess_gpu import PreprocessGpuStage


def build_inference(
    config: PipelineConfig,
    *,
    decode_here: bool = False,
    answer_here: bool = False,
    fetch: Fetch | None = None,
    progress: Callable[[LoadReport], None] | None = None,
) -> InferenceStage:
    """The inference stage of ``config``: its executor, every model loaded and every bucket
    warmed (a model that fails is refused, the others served; ``ModelsRefused`` when none,
    or a required one, loads). ``decode_here``: it decodes image bytes in this process;
    ``answer_here``: it makes the answers; ``fetch``: PreprocessGPU decodes and sends the
    batches here. ``progress`` is told of each step of loading (the replica publishes it)."""
    executor = GpuExecutor(config.executor)
    report = load_models(executor, config, progress=progress)
    refuse_start(report)  # ModelsRefused (one line): no model, or a required one, loads
    served = config.model_copy(
        update={"models": [m for m in config.models if m.name not in report.refused]}
    )
    answerer = None
    if answer_here:  # JPEG answers resized and encoded on the GPU where it can
        answerer = PostprocessStage(served, DeviceAnswers.make(served, executor))
    receiver = None
    if fetch is not None:  # where PreprocessGPU sends batches
        receiver = BatchReceiver(executor.backend, config.transport.timeout_s)
    return InferenceStage(
        config,
        executor,
        report,
        decoder=local_decoder(served, executor) if decode_here else None,
        answerer=answerer,
        fetch=fetch,
        receiver=receiver,
    )


def local_decoder(config: PipelineConfig, executor: GpuExecutor) -> Decoder:
    """Decoding and resizing in the executor's process: on its GPU (nvImageCodec, one resize
    launch, batches from its pool), or on worker threads beside numpy."""
    if not executor.backend.is_cuda:
        return PreprocessStage(config)
    return PreprocessGpuStage(config, executor.backend.device_id, local=True, pool=executor.pool)
