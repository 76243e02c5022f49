"""The executor's models: each one's engine on the device, its weights and its buckets, and
the plans that ``prepare`` asks of them."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .engines.base import Engine, EngineContext, EnginePlan, Feed
from .errors import InvalidInput, ModelNotFound
from .executor_precision import Precision, choose
from .memory import round_up
from .models.registry import LoadedModel

logger = logging.getLogger("pipeline.executor")


@dataclass
class ServedModel:
    loaded: LoadedModel
    engine: Engine
    weights_bytes: int
    buckets: tuple[int, ...]  # the executor's, up to the model's max_batch
    precision: Precision  # its compute dtype (its engine's context), and why


class ModelTable:
    """Models by name, each loaded with its own ``EngineContext`` -- the executor's, in the
    compute dtype chosen for it (``executor_precision.choose``) -- at the executor's buckets."""

    def __init__(self, ctx: EngineContext, buckets: tuple[int, ...]) -> None:
        self.ctx = ctx
        self.buckets = buckets
        self._models: dict[str, ServedModel] = {}

    def build(
        self,
        loaded: LoadedModel,
        max_batch: int | None,
        buckets: tuple[int, ...] | None = None,
        precision: str = "auto",
    ) -> ServedModel:
        """Put ``loaded``'s engine on the device in its compute dtype (the entry's
        ``precision``, else the executor's, probed), checked; not yet served (``add``)."""
        engine = loaded.engine
        try:
            return self._checked(loaded, choose(engine, self.ctx, precision), max_batch, buckets)
        except BaseException:
            engine.close()  # what it put on the device: nothing of a refused model stays
            raise

    def _checked(
        self,
        loaded: LoadedModel,
        chosen: Precision,
        max_batch: int | None,
        buckets: tuple[int, ...] | None,
    ) -> ServedModel:
        engine = loaded.engine
        inputs = engine.inputs
        if len(inputs) != 1:
            raise InvalidInput(
                "models with more than one input tensor are not served yet",
                model=loaded.name,
                inputs=[t.name for t in inputs],
            )
        base = buckets or self.buckets
        run_at = tuple(b for b in base if max_batch is None or b <= max_batch)
        if not run_at:
            raise InvalidInput(
                "max_batch is below the smallest bucket",
                model=loaded.name,
                max_batch=max_batch,
                buckets=base,
            )
        m = ServedModel(loaded, engine, engine.weights_bytes, run_at, chosen)
        logger.info(
            "loaded %s (%s engine, %s): %.1f MB of weights, %s",
            loaded.name,
            engine.name,
            loaded.source,
            m.weights_bytes / 1e6,
            chosen.dtype,
        )
        return m

    def add(self, m: ServedModel) -> None:
        self._models[m.loaded.name] = m

    def pop(self, name: str) -> ServedModel | None:
        return self._models.pop(name, None)

    def get(self, name: str) -> ServedModel:
        m = self._models.get(name)
        if m is None:
            raise ModelNotFound("no such model", model=name, served=sorted(self._models))
        return m

    def loaded(self) -> dict[str, LoadedModel]:
        return {k: m.loaded for k, m in self._models.items()}

    def values(self) -> list[ServedModel]:
        return list(self._models.values())

    def buckets_of(self, model: str | None) -> tuple[int, ...]:
        return self.buckets if model is None else self.get(model).buckets

    def bucket_for(self, n: int, model: str | None = None) -> int:
        buckets = self.buckets_of(model)
        for b in buckets:
            if b >= n:
                return b
        raise InvalidInput(
            "batch larger than the largest bucket", batch_size=n, max_bucket=buckets[-1]
        )

    def plan(self, model: str, bucket: int, feed: Feed = "image") -> EnginePlan:
        engine = self.get(model).engine
        return engine.plan(bucket, engine.feed_for(feed))

    def slot_bytes(self) -> int:
        """The staging slot every model's largest bucket fits: its input, then each output."""
        need = 0
        for name, m in self._models.items():
            for feed in m.engine.feeds:
                plan = self.plan(name, m.buckets[-1], feed)
                need = max(need, slot_bytes(plan))
        return need


def slot_bytes(plan: EnginePlan) -> int:
    return round_up(plan.input_spec.nbytes, 256) + sum(
        round_up(s.nbytes, 256) for s in plan.output_specs
    )
