"""The one factory of Ferry's Serve deployments (all but the ingress, whose routes make it a
FastAPI app): a replica validates the pipeline config, applies its stage's process settings
(``DeploymentOptions.apply_in_process``), builds the stage core (``pipeline.stages``) and
forwards calls to it -- ``__call__`` to ``run``, the other methods by name.

Answers made in a replica (``stamps_hops``) carry when their call arrived and when it left
(``Timings.hop``, wall-clock ms), so the ingress can split the Serve hop into the way there
and back; only a real hop is stamped.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from ray import serve

from pipeline.config import PipelineConfig
from pipeline.stages.base import Stage
from pipeline.stages.messages import Answer, Hop


def stamp_hops(out: Any, arrived: float) -> Any:
    if isinstance(out, list):
        left = time.time() * 1e3
        for a in out:
            if isinstance(a, Answer):
                a.timings.hop = Hop(arrived, left)
    return out


def _forward(method: str, stamp: bool) -> Callable[..., Any]:
    target = "run" if method == "__call__" else method

    async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        arrived = time.time() * 1e3
        out = getattr(self.core, target)(*args, **kwargs)
        if inspect.isawaitable(out):
            out = await out
        return stamp_hops(out, arrived) if stamp else out

    call.__name__ = method
    return call


def stage_deployment(
    name: str,
    options: str,
    build: Callable[..., Stage],
    methods: tuple[str, ...] = (),
    stamps_hops: tuple[str, ...] = (),
    call: bool = True,
) -> Any:
    """A Serve deployment ``name`` whose replicas run ``build(config, **given)``: ``given``
    are the handles and choices the composition root binds it with.

    ``options``: the ``PipelineConfig`` field of its Serve options (``preprocess_deployment``);
    ``methods``: what it answers besides ``__call__`` (forwarded to the core's ``run``; none
    without ``call``); ``stamps_hops``: the methods whose answers carry the hop's arrival
    and departure.
    """

    def __init__(self: Any, config: dict[str, Any], **given: Any) -> None:
        cfg = PipelineConfig.model_validate(config)
        getattr(cfg, options).apply_in_process()
        self.core = build(cfg, **given)

    def check_health(self: Any) -> None:
        self.core.check_health()

    body: dict[str, Any] = {"__init__": __init__, "check_health": check_health}
    for m in ("__call__", *methods) if call else methods:
        body[m] = _forward(m, m in stamps_hops)
    body["__doc__"] = f"Serve replica of {build.__name__} (``deployments.replica``)."
    cls = type(name, (), body)
    return serve.deployment(name=name)(cls)
