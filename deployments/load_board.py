"""What an inference replica says while it starts, for the ingress to tell before -- or
instead of -- that replica answering (readiness's ``why``, a refused model's 503).

The inference stage loads and warms its models in its constructor, so Serve sends it nothing
until it has; and when none loads it never answers at all (Serve starts it again, a bounded
number of times, then ``DEPLOY_FAILED``). The ingress is up meanwhile. Each step of loading
(``LoadReport.as_dict``: the phase, the models loaded and refused with their reasons, the one
at hand) is put in Ray's key-value store under the application's name and the digest of its
pipeline config; the ingress reads it when the inference deployment does not answer.

Keyed by the config's digest, so the replicas of a new config never read what an older
config's replicas said; a replica of the same config starting again writes over it at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import Any

from ray import serve

from .drain import RayKv

logger = logging.getLogger(__name__)


def digest(config: Any) -> str:
    """The pipeline config's digest (the same in every replica of one deploy)."""
    return hashlib.sha256(config.model_dump_json().encode()).hexdigest()[:16]


def key(app: str, config_digest: str) -> bytes:
    return b"load\0" + app.encode() + b"\0" + config_digest.encode()


class LoadBoard:
    """One application's (and config's) load report: ``publish`` in the inference replica,
    ``read`` in the ingress. ``kv``: Ray's store (``drain.RayKv``); tests pass their own."""

    def __init__(self, app: str, config: Any, kv: Any = None) -> None:
        self.key = key(app, digest(config))
        self.kv = kv if kv is not None else RayKv()

    def publish(self, report: Any) -> None:
        """Put a ``LoadReport`` (never raises: the store may be briefly away)."""
        try:
            body = {**report.as_dict(), "at": time.time()}
            self.kv.put(self.key, json.dumps(body).encode())
        except Exception as exc:
            logger.debug("publishing the load report failed: %s", exc)

    def read(self) -> dict[str, Any] | None:
        raw = self.kv.get(self.key)
        return None if raw is None else json.loads(raw)


def for_this_replica(config: Any) -> LoadBoard | None:
    """The board of the replica's application; None outside a Serve replica (a test building
    the stage or the ingress class directly)."""
    try:

        return LoadBoard(serve.get_replica_context().app_name, config)
    except Exception:
        return None


def why_of(report: dict[str, Any] | None) -> str:
    """Why the application is not ready, from the inference replica's last report."""
    if report is None:
        return "starting: no inference replica has begun loading the models yet"
    n, done, current = len(report["models"]), len(report["loaded"]), report.get("current")
    refused = report.get("refused") or {}
    if report["phase"] == "failed":
        return "refused: " + (report.get("why") or "no model of the config loads")
    counted = f"{done} of {n} models loaded" + (f", {len(refused)} refused" if refused else "")
    if report["phase"] == "loading":
        return f"warming: {counted}; loading {current}"
    if report["phase"] == "warming":
        return f"warming: {counted}; warming up {current or 'the models'}"
    return f"starting: {counted}; the inference replica is not answering yet"
