"""The ingress's way downstream: one object per placement, awaited the same way whatever
the placement is -- a Serve hop, or a direct call in this process.

* ``ServeChain`` (``four_stage``): Preprocess -> Inference -> Postprocess, chained as
  DeploymentResponses, so images and logits go from stage to stage by reference and only
  the small answers come back here.
* ``ServeHop`` (``split``, ``gpu_preprocess``): one Serve call per coalesced group to an
  inference replica, which decodes (or has PreprocessGPU decode) and answers.
* ``InProcess`` (``one_process``): the inference stage built in this process and called
  directly: no handle, no hop.

Where a Serve call reaches the replica that answers (``ServeHop``), that replica stamps
when the call arrived and left (``Timings.hop``), and the ingress splits the hop's time;
elsewhere the answers carry no hop.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import PipelineConfig
from pipeline.errors import FerryError
from pipeline.stages.messages import Answer, Encoded, HostRows, PostSpec, RequestMeta


class ServeChain:
    """``four_stage``: three Serve deployments, their calls chained."""

    def __init__(self, preprocess: Any, inference: Any, postprocess: Any) -> None:
        self.pre, self.inf, self.post = preprocess, inference, postprocess

    async def classify(
        self, model: str, items: list[Encoded], meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        images = self.pre.remote(model, items)
        logits = self.inf.remote(model, images, meta)  # images go by reference
        return await self.post.remote(model, logits, specs)

    async def tensors(
        self, model: str, rows: HostRows, meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        logits = self.inf.remote(model, rows, meta, None, "tensors")
        return await self.post.remote(model, logits, specs)

    async def status(self) -> Any:
        return await self.inf.status.remote()

    async def signatures(self) -> dict[str, Any]:
        return await self.inf.signatures.remote()


class ServeHop(ServeChain):
    """``split``, ``gpu_preprocess``: one Serve call to the inference replica, which answers."""

    def __init__(self, inference: Any) -> None:
        super().__init__(None, inference, None)

    async def classify(
        self, model: str, items: list[Encoded], meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        return await self.inf.encoded.remote(model, items, meta, specs)

    async def tensors(
        self, model: str, rows: HostRows, meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        return await self.inf.remote(model, rows, meta, specs, "tensors")


class InProcess:
    """``one_process``: the inference stage in this process, called directly."""

    def __init__(self, config: PipelineConfig) -> None:
        from pipeline.stages.inference import InferenceStage

        self.stage = InferenceStage(config)

    async def classify(
        self, model: str, items: list[Encoded], meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        return await self.stage.encoded(model, items, meta, specs)

    async def tensors(
        self, model: str, rows: HostRows, meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        out = await self.stage.run(model, rows, meta, specs, "tensors")
        assert isinstance(out, list)
        return out

    async def status(self) -> Any:
        return self.stage.status()

    async def signatures(self) -> dict[str, Any]:
        return self.stage.signatures()

    def check_health(self) -> None:
        self.stage.check_health()


def downstream(
    config: PipelineConfig, preprocess: Any = None, inference: Any = None, postprocess: Any = None
) -> ServeChain | ServeHop | InProcess:
    """The way downstream of this config's placement, from the handles it was bound with."""
    form = config.form
    if form.executor_in == "ingress":
        return InProcess(config)
    if "postprocess" in form.deployments:
        return ServeChain(preprocess, inference, postprocess)
    return ServeHop(inference)
