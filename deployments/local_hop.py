"""The local hop in a Serve application (``pipeline/transport/local_hop.py``): where this
replica's sockets are -- the node and the application name the directory -- and the
inference replica's server, started in its event loop.

``split`` and ``gpu_preprocess`` use it unless ``transport.local_hop`` is off, or the
inference deployment autoscales (Serve would not see the socket's calls as load).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import re
import time
from typing import Any

from pipeline.config import PipelineConfig
from pipeline.stages.inference import InferenceStage
from pipeline.transport.local_hop import HopServer, hop_dir

from .replica import stamp_hops

logger = logging.getLogger(__name__)
_SERVERS: list[HopServer] = []  # the replica's server lives as long as its process


def enabled(config: PipelineConfig) -> bool:
    """Whether the ingress reaches this config's inference replicas by the local hop."""
    return (
        config.transport.local_hop
        and config.placement_row.way_down == "hop"
        and config.inference_deployment.autoscaling_config is None
    )


def directory() -> tuple[str, str] | None:
    """This replica's socket directory and its own name in it; None outside a Serve replica
    (a test building the class)."""
    try:
        import ray
        from ray import serve

        ctx = serve.get_replica_context()
        node = ray.get_runtime_context().get_node_id()
    except Exception:
        return None
    return hop_dir(node, ctx.app_name), re.sub(r"[^A-Za-z0-9_.-]", "_", ctx.replica_tag)


def serve_stage(stage: InferenceStage, config: PipelineConfig) -> None:
    """Start this inference replica's socket server in the running loop (Serve builds a
    replica in its event loop); nothing where the hop is off or there is no replica."""
    where = directory() if enabled(config) else None
    if where is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        logger.warning("local hop: no event loop in the replica's constructor; Serve calls only")
        return

    methods = {"encoded": stage.encoded, "answers": stage.answers}  # what LocalHop sends

    async def handle(method: str, args: tuple) -> Any:
        arrived = time.time() * 1e3
        if method not in methods:
            raise ValueError(f"local hop: no method {method!r}")
        return stamp_hops(await methods[method](*args), arrived)

    server = HopServer(where[0], where[1], handle)
    _SERVERS.append(server)
    atexit.register(server.close)

    async def start() -> None:
        try:
            await server.start()
        except OSError as exc:
            logger.warning(
                "local hop: cannot listen on %s (%s); Serve calls only", server.path, exc
            )

    loop.create_task(start())
