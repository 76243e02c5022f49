"""The ingress's way downstream, awaited the same way whichever it is -- chained Serve calls,
one Serve hop, or a direct call in this process. The composition root (``deployments/app.py``)
names it (``WayDown``, from its placement's row) and hands over the handles; ``way_down``
builds it.

* ``ServeChain`` (``four_stage``): Preprocess -> Inference -> Postprocess, chained as
  DeploymentResponses, so images and logits go from stage to stage by reference and only
  the small answers come back here.
* ``ServeHop`` (``split``, ``gpu_preprocess``): one Serve call per coalesced group to an
  inference replica, which decodes (or has PreprocessGPU decode) and answers.
* ``LocalHop`` (the same placements, ``transport.local_hop``): the group over a Unix socket
  to an inference replica of this node, a Serve call where there is none.
* ``InProcess`` (``one_process``): the inference stage built in this process and called
  directly: no handle, no hop.

Where a call reaches the replica that answers (``ServeHop``, ``LocalHop``), that replica
stamps when the call arrived and left (``Timings.hop``), and the ingress splits the hop's
time; elsewhere the answers carry no hop.
"""

from __future__ import annotations

from typing import Any

from pipeline.config import PipelineConfig
from pipeline.config.placements import WayDown
from pipeline.errors import FerryError
from pipeline.stages.build import build_inference
from pipeline.stages.inference import InferenceStage
from pipeline.stages.messages import Answer, Encoded, HostRows, PostSpec, RequestMeta
from pipeline.transport.local_hop import HopClient, HopLost

from . import local_hop


class ServeChain:
    """``four_stage``: three Serve deployments, their calls chained."""

    def __init__(self, preprocess: Any, inference: Any, postprocess: Any) -> None:
        self.pre, self.inf, self.post = preprocess, inference, postprocess

    async def classify(
        self, model: str, items: list[Encoded], meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        images = self.pre.remote(model, items)
        logits = self.inf.logits.remote(model, images, meta)  # images go by reference
        return await self.post.remote(model, logits, specs)

    async def tensors(
        self, model: str, rows: HostRows, meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        logits = self.inf.logits.remote(model, rows, meta, "tensors")
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
        return await self.inf.answers.remote(model, rows, meta, specs, "tensors")


class LocalHop(ServeHop):
    """``split``, ``gpu_preprocess`` where an inference replica runs on this node: the group
    over a Unix socket to it (``transport/local_hop.py``); Serve's call where none does, or
    where its socket closed before the group was answered."""

    def __init__(self, inference: Any, client: HopClient) -> None:
        super().__init__(inference)
        self.client = client

    async def classify(
        self, model: str, items: list[Encoded], meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        try:
            return await self.client.call("encoded", (model, items, meta, specs), len(items))
        except HopLost:
            return await super().classify(model, items, meta, specs)

    async def tensors(
        self, model: str, rows: HostRows, meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        try:
            args = (model, rows, meta, specs, "tensors")
            return await self.client.call("answers", args, len(meta))
        except HopLost:
            return await super().tensors(model, rows, meta, specs)


class InProcess:
    """``one_process``: the inference stage in this process, called directly."""

    def __init__(self, stage: InferenceStage) -> None:
        self.stage = stage

    async def classify(
        self, model: str, items: list[Encoded], meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        return await self.stage.encoded(model, items, meta, specs)

    async def tensors(
        self, model: str, rows: HostRows, meta: list[RequestMeta], specs: list[PostSpec]
    ) -> list[Answer | FerryError]:
        return await self.stage.answers(model, rows, meta, specs, "tensors")

    async def status(self) -> Any:
        return self.stage.status()

    async def signatures(self) -> dict[str, Any]:
        return self.stage.signatures()

    def check_health(self) -> None:
        self.stage.check_health()


def way_down(
    way: WayDown,
    config: PipelineConfig,
    preprocess: Any = None,
    inference: Any = None,
    postprocess: Any = None,
) -> ServeChain | ServeHop | InProcess:
    """The way ``way`` from the handles it needs; ``in_process`` builds the inference stage
    here, decoding and answering in this process."""
    if way == "in_process":
        return InProcess(build_inference(config, decode_here=True, answer_here=True))
    if way == "chain":
        return ServeChain(preprocess, inference, postprocess)
    where = local_hop.directory() if local_hop.enabled(config) else None
    if where is not None:
        return LocalHop(inference, HopClient(where[0]))
    return ServeHop(inference)
