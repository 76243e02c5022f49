"""PreprocessGPU: the Serve wrapper of GPU preprocessing (``pipeline.preprocess_gpu``).

The stage's core decodes, fits the images on a GPU under the executor's contract and hands
the batch on; here it is given its CPU decoder and wrapped in the ``Rows`` message. As a
deployment, the inference replica drives it: it calls it with its own endpoint in ``to``,
so the sender knows whom to send to (a Serve handle picks the replica, so the receiving
end has to say who it is). Fused into the inference replica (``make_stage(local=True)``)
the rows come back as device views of the batch instead.
"""

from __future__ import annotations

from typing import Any

from ray import serve

from pipeline.config import PipelineConfig
from pipeline.memory import DevicePool
from pipeline.preprocess_gpu.stage import PreprocessGpuCore

from .messages import Rows
from .preprocess import PreprocessCore


class PreprocessGpuStage:
    """The core with the CPU stage's decoder, answering in ``Rows``."""

    def __init__(
        self,
        config: PipelineConfig,
        device: int = 0,
        local: bool = False,
        pool: DevicePool | None = None,
    ) -> None:
        cpu = PreprocessCore(config, fitted=False)  # decoding, as the CPU stage does it
        self.core = PreprocessGpuCore(config, cpu, device, local, pool)

    async def run(
        self, model: str, items: list[tuple[bytes, str | None]], to: dict | None = None
    ) -> Rows:
        data, owner, errors, timings, env = await self.core.process(model, items, to)
        return Rows(len(items), data, owner, errors, timings, envelope=env)

    def close(self) -> None:
        self.core.close()


@serve.deployment
class PreprocessGPU:
    def __init__(self, config: dict[str, Any]) -> None:
        cfg = PipelineConfig.model_validate(config)
        cfg.preprocess_deployment.apply_in_process()
        self.stage = PreprocessGpuStage(cfg)

    async def __call__(self, model: str, items: list[tuple[bytes, str | None]], to: dict) -> Rows:
        return await self.stage.run(model, items, to)

    def check_health(self) -> None:
        from pipeline.health import probe

        probe(self.stage.core.backend)  # a lost CUDA context: Serve replaces the replica
