"""Loading a config's models: the one load check, run by the inference stage as its replica
starts (``InferenceStage``) and by ``ferry config check`` before a deploy
(``pipeline.check.check_models``, on an executor of its own).

``load_models(executor, config)`` builds each entry's engine and checks it against the entry
(``repository.load_entry``), puts it on the executor, plans every bucket of every feed and --
in a replica -- warms it (runs every bucket, capturing its CUDA graphs). A model that fails
any of it is *refused*: its reason, one line (for an ONNX file it names the node and the op),
is recorded, what it held is given back, and the other models load on. Each model's compute
dtype is decided as it loads (its entry's ``precision``, else the executor's, probed where
that is float16: ``pipeline/executor_precision.py``) and the report says which and why.

The rule (README, "A model that cannot load"): a replica serves the models that load and
answers the refused ones' routes with ``ModelUnavailable`` -- 503, no Retry-After, the
reason in the answer -- so one bad model does not take the good ones down. When no model
loads, or a model marked ``required`` is refused, the replica cannot serve what it was
deployed for: its constructor raises ``ModelsRefused``, whose ``str`` is that one line, and
Serve, after its bounded retries, puts the application into ``DEPLOY_FAILED``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import FerryError

logger = logging.getLogger(__name__)
MAX_REASON = 400  # characters of a refusal's reason: one line in an answer, a log, a status


class ModelUnavailable(FerryError):
    """A model of the config that is not served: it was refused when it loaded (its
    ``reason``). 503, but not a retry's matter -- the same files and config refuse it again --
    so the answer has no Retry-After; a new model file or config and a redeploy fix it."""

    http_status = 503
    retryable = False

    def __init__(self, message: str = "", *, model: str, reason: str, **fields: Any) -> None:
        # the reason whole in the message (an answer's detail cuts long fields short)
        message = (
            message or f"model {model!r} is not served: it was refused when it loaded: {reason}"
        )
        super().__init__(message, model=model, reason=reason, **fields)
        self.model = model
        self.reason = reason


class ModelsRefused(FerryError):
    """The replica cannot serve what it was deployed for (no model loads, or a required one
    is refused): its constructor's error. Its ``str`` is one line -- what Serve's
    ``DEPLOY_FAILED`` status message ends with."""

    http_status = 503
    retryable = False

    def __str__(self) -> str:
        return self.message


def reason_of(exc: BaseException) -> str:
    """A load failure as one line: the error's type and text, whitespace folded, cut short."""
    text = " ".join(str(exc).split())
    line = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return line if len(line) <= MAX_REASON else line[: MAX_REASON - 3] + "..."


@dataclass
class LoadReport:
    """Where loading stands: the config's models, those loaded and those refused (with their
    reasons), the model at hand and the phase (``loading``, ``warming``, ``ready``,
    ``failed``). ``as_dict`` is what the inference replica publishes while it starts."""

    models: list[str]
    required: list[str] = field(default_factory=list)
    loaded: list[str] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)
    phase: str = "loading"
    current: str | None = None
    warmup_s: dict[str, float] = field(default_factory=dict)
    precision: dict[str, Any] = field(default_factory=dict)  # model -> its ``Precision``

    def problems(self) -> list[str]:
        """One line per refused model, naming it."""
        return [f"model {name!r}: {why}" for name, why in self.refused.items()]

    def unservable(self) -> str | None:
        """Why the replica cannot serve at all (one line), or None."""
        needed = [n for n in self.required if n in self.refused]
        if needed:
            return "required model(s) refused: " + "; ".join(
                f"model {n!r}: {self.refused[n]}" for n in needed
            )
        if not self.loaded:
            return "no model of the config loads: " + "; ".join(self.problems())
        return None

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "models": list(self.models),
            "loaded": list(self.loaded),
            "refused": dict(self.refused),
            "current": self.current,
            "precision": {
                n: p.as_dict() for n, p in self.precision.items() if n in self.loaded
            },
            "why": self.unservable() if self.phase == "failed" else None,
        }


def load_models(
    executor: Any,
    config: Any,
    warm: bool = True,
    progress: Callable[[LoadReport], None] | None = None,
) -> LoadReport:
    """Load (and with ``warm``, warm) every model of ``config`` into ``executor``; the refused
    are unloaded and recorded, never raised. ``progress`` is told of each step."""
    tell = progress or (lambda _r: None)
    report = LoadReport(
        [m.name for m in config.models], [m.name for m in config.models if m.required]
    )
    for entry in config.models:
        report.current = entry.name
        tell(report)
        try:
            executor.load_entry(entry)
            report.precision[entry.name] = executor.precision_of(entry.name)
            plan_every_bucket(executor, entry.name)
        except Exception as exc:
            _refuse(executor, report, entry.name, exc)
        else:
            report.loaded.append(entry.name)
    if warm and report.loaded:
        report.phase, report.current = "warming", None
        tell(report)

        def starting(name: str) -> None:
            report.current = name
            tell(report)

        def failed(name: str, exc: Exception) -> None:
            report.loaded.remove(name)
            _refuse(executor, report, name, exc)

        report.warmup_s = executor.warmup(list(report.loaded), starting, failed)
    report.current = None
    report.phase = "failed" if report.unservable() else "ready"
    tell(report)
    return report


def plan_every_bucket(executor: Any, model: str) -> None:
    """Plan the model at each of its buckets and feeds (shapes, arenas, workspaces): what a
    batch would meet, found without running one."""
    engine = executor.engine_of(model)
    for feed in engine.feeds:
        for bucket in executor.buckets(model):
            executor.plan(model, bucket, feed)


def _refuse(executor: Any, report: LoadReport, name: str, exc: Exception) -> None:
    reason = reason_of(exc)
    report.refused[name] = reason
    logger.info("model %s is refused: %s", name, reason)
    try:
        executor.unload(name)
    except Exception as unload_exc:  # what it held stays; the report says why it is not served
        logger.warning("unloading the refused model %s failed: %s", name, unload_exc)


def refuse_start(report: LoadReport) -> None:
    """Raise ``ModelsRefused`` (one line) when the replica cannot serve at all."""
    why = report.unservable()
    if why is not None:
        logger.error("Ferry cannot serve this config: %s", why)
        raise ModelsRefused(why)
    for line in report.problems():
        logger.warning("serving without %s", line)
