"""The GPU preprocess stage (``PreprocessGpuStage``): ``pipeline.preprocess_gpu``'s core
given the CPU stage's decoder (for PNG and what the GPU decoder refuses) and answering in
``DeviceRows``.

Two places it runs (the placement decides): inside the inference stage (``local=True``,
``one_process`` and ``split`` on a GPU: the rows are device views of a batch from the
inference executor's pool) and as the PreprocessGPU deployment (``gpu_preprocess``: the
batch is sent where ``to`` says, the rows carry its envelope).
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.health import probe
from pipeline.memory import DevicePool
from pipeline.preprocess_gpu.stage import PreprocessGpuCore

from .decode import PreprocessStage
from .messages import DeviceRows, Encoded, SendTo


class PreprocessGpuStage:
    """Decode, fit on a GPU and hand the batch on (``pipeline.preprocess_gpu``)."""

    def __init__(
        self,
        config: PipelineConfig,
        device: int = 0,
        local: bool = False,
        pool: DevicePool | None = None,
    ) -> None:
        cpu = PreprocessStage(config, fitted=False)  # decoding, as the CPU stage does it
        self.core = PreprocessGpuCore(config, cpu, device, local, pool)

    async def run(self, model: str, items: list[Encoded], to: SendTo | None = None) -> DeviceRows:
        return await self.core.process(model, items, to)

    def check_health(self) -> None:

        probe(self.core.backend)  # a lost CUDA context: Serve replaces the replica

    def close(self) -> None:
        self.core.close()
