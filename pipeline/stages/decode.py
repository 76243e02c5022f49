"""The decode stage (``PreprocessStage``): checked image bytes -> a uint8 batch at the
model's input size.

JPEG through simplejpeg, PNG and what simplejpeg refuses through Pillow, then resize (and
centre crop where the model wants it). Decoding runs in a thread pool -- both libraries
release the GIL -- so the replica's event loop only ever schedules work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from pipeline import metrics
from pipeline.config import PipelineConfig
from pipeline.errors import FerryError, InvalidInput, ModelNotFound
from pipeline.handoff import Workers
from pipeline.imaging import DecodePlan, bound_decoder_scratch, decode, decode_unfitted
from pipeline.models.repository import model_card

from .messages import Encoded, HostRows

logger = logging.getLogger(__name__)


class PreprocessStage:
    """Decode and resize on worker threads; no Ray (the Preprocess deployment wraps it, the
    inference stage runs it in place, GPU preprocessing decodes with it on the CPU)."""

    def __init__(self, config: PipelineConfig, fitted: bool = True) -> None:
        """``fitted=False`` (GPU preprocessing) leaves the resize to the caller: images come
        out decoded at the smallest size ``fit`` could resize from."""
        self.config = config
        self.targets = {m.name: model_card(m).target() for m in config.models}
        self.max_pixels = config.ingress.max_pixels
        self.max_work_bytes = config.ingress.max_image_work_bytes
        bound_decoder_scratch()  # freed decoder buffers go back to the system
        self.threads = config.preprocess.threads
        self.pool = Workers(self.threads, "ferry-decode")
        self._decode = decode if fitted else decode_unfitted

    def decode_one(
        self, model: str, data: bytes, content_type: str | None, plan: DecodePlan | None = None
    ) -> np.ndarray:
        """One image; ``plan``: the one the ingress made from its header (not parsed again)."""
        target = self.targets.get(model)
        if target is None:
            raise ModelNotFound("no such model", model=model)
        return self._decode(
            data, content_type, target, self.max_pixels, self.max_work_bytes, plan=plan
        )

    def _decode_share(self, model: str, items: list[Encoded]) -> list[Any]:
        """One pool thread's share of a call: each image, or the error it raised."""
        out: list[Any] = []
        for it in items:
            try:
                out.append(self.decode_one(model, it.data, it.content_type, it.plan))
            except Exception as exc:  # this image's own failure
                out.append(exc)
        return out

    async def decode_many(
        self, model: str, items: list[Encoded]
    ) -> tuple[list[np.ndarray], list[int], dict[int, FerryError]]:
        """Decode every item in the pool: the images, which request each is, and the errors
        of the requests that failed (one bad image never fails its neighbours). One pool
        call per thread, each decoding every ``threads``-th image, not one per image: a
        pool call and its wake-up of the event loop cost about as much CPU as decoding a
        small PNG."""
        k = min(len(items), max(1, self.threads))  # (no call for no items)
        shares = await asyncio.gather(
            *(self.pool.run(self._decode_share, model, items[i::k]) for i in range(k))
        )
        done: list[Any] = [None] * len(items)
        for i, share in enumerate(shares):
            done[i::k] = share
        imgs, owner, errors = [], [], {}
        for i, r in enumerate(done):
            if isinstance(r, FerryError):
                errors[i] = r
            elif isinstance(r, BaseException):
                logger.exception("decoding failed unexpectedly", exc_info=r)
                errors[i] = InvalidInput(
                    "could not decode the image", detail=f"{type(r).__name__}: {r}"
                )
            else:
                imgs.append(r)
                owner.append(i)
        return imgs, owner, errors

    async def run(self, model: str, items: list[Encoded]) -> HostRows:
        t0 = time.perf_counter()
        rows, owner, errors = await self.decode_many(model, items)
        ms = (time.perf_counter() - t0) * 1e3
        metrics.observe_stage("preprocess", model, ms, len(items))
        return HostRows(len(items), owner, errors, ms, data=np.stack(rows) if rows else None)

    def check_health(self) -> None:
        """Healthy while the process lives: decoding holds no device and no queue of its own: a stuck decode shows as the
        caller's timeout, not here."""

    def close(self) -> None:
        """End the decode threads, once the decodes queued are done."""
        self.pool.close()
