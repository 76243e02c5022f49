"""Each model's compute dtype, decided once when it loads (``choose``), and the probe behind it.

    precision = choose(engine, ctx, "auto")   # the engine loaded in precision.dtype

The entry's ``precision`` (``float16``, ``float32``) is taken as it is. ``auto`` is the
executor's dtype (``executor.dtype``: float16 on cupy, float32 on numpy), except that where
that is float16 the model is *probed* first: one batch of the same seeded input
(``engines.base.probe_input``: random uint8 pixels through the image feed, else the model's
own tensors) at bucket 1, once in float32 and once in float16, each straight on the engine
(``Engine.trial``: its weights in that dtype, one eager run, the outputs on the host). The
model is served in float16 unless its float16 output is

* not finite (NaN or infinity where float32's is finite: an overflow past 65504), or
* far from float32's: ``max |fp16 - fp32| / max |fp32|`` over every float output greater than
  ``FP16_TOLERANCE`` (1e-2), or
* not computed at all (float16 raises: a graph with float32 baked in),

and then it is served in float32, with one WARNING line naming the model, the measure and
the threshold. Why 1e-2: float16 keeps 11 significant bits (a unit roundoff of 4.9e-4), and a
normal network in float16 agrees with float32 to about 1e-3 of its largest output (4-7e-4
on five torchvision classifiers imported from ONNX, on an H200, issue 29; on numpy, the
probe measures 4.5e-4 for the built-in ``digits`` and 5.8e-4 for the tests' small ONNX CNN),
the error growing slowly with depth. An overflow is not a little further: it gives infinity
or NaN, or -- where a saturated intermediate is normalised away -- an error of order 1.
1e-2 is some ten times the rounding of a normal model and far below what overflow does. It is
relative to the largest output, not to each value, so logits near zero, whose relative error
is large under any rounding, do not trip it. Top-1 agreement is not used: on one random
input a classifier's top two are often a rounding apart.

Trials run float32 first, so a model kept in float16 is loaded as it was left (an engine
whose trial is not its load -- torch's trials run eagerly, its load compiles -- is loaded
once more in float16); a model served in float32 is loaded once more. Each load replaces the engine's weights (one copy on
the device at a time), and each trial's arena (bucket 1) is given back at once.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from .device import Stream
from .engines.base import Engine, EngineContext, Feed

logger = logging.getLogger("pipeline.executor")
FP16_TOLERANCE = 1e-2  # max |fp16 - fp32| / max |fp32| over the probe; the reason above
MEASURE = "max|fp16 - fp32| / max|fp32|"
ChosenBy = Literal["executor", "entry", "engine", "probe"]


@dataclass(frozen=True)
class Precision:
    """A model's compute dtype and what decided it: the executor's dtype (no probe), the
    entry's ``precision``, the engine (which has no float16 path on this backend: torch on
    the CPU), or the probe (with its measure: ``error``, infinite where the float16 output
    is not finite; ``failed``: float16 raised)."""

    dtype: str
    chosen_by: ChosenBy
    error: float | None = None
    failed: str | None = None

    def text(self) -> str:
        """One line: the dtype and why, e.g. ``float32 (probe: ... = inf > 0.01)``."""
        return f"{self.dtype} ({self.reason()})"

    def reason(self) -> str:
        """Why this dtype: ``probe: float16 output not finite, max|fp16 - fp32| / ...``."""
        if self.chosen_by == "executor":
            return "the executor's dtype"
        if self.chosen_by == "entry":
            return "the entry's precision"
        if self.chosen_by == "engine":
            return f"the engine computes only in {self.dtype} on this backend"
        if self.failed is not None:
            return f"probe: float16 does not run: {self.failed}"
        err = self.error if self.error is not None else math.nan
        op = "<=" if err <= FP16_TOLERANCE else ">"
        what = "" if math.isfinite(err) else "float16 output not finite, "
        if math.isnan(err):
            what = "float32 output not finite either, "
        return f"probe: {what}{MEASURE} = {err:.2g} {op} {FP16_TOLERANCE:g}"

    def as_dict(self) -> dict[str, Any]:
        """For JSON (``ferry models --json``, the load report): a non-finite measure is null,
        with ``fp16_finite`` false."""
        err = self.error
        return {
            "dtype": self.dtype,
            "chosen_by": self.chosen_by,
            "fp16_error": err if err is not None and math.isfinite(err) else None,
            "fp16_finite": None if err is None else math.isfinite(err),
            "threshold": FP16_TOLERANCE if self.chosen_by == "probe" else None,
            "why": self.text(),
        }


def fp16_error(out16: tuple[np.ndarray, ...], out32: tuple[np.ndarray, ...]) -> float:
    """``max |fp16 - fp32| / max |fp32|`` of each float output, the largest: ``inf`` where the
    float16 output holds NaN or infinity (and float32's does not), ``nan`` where float32's
    does too (the probe cannot judge; both are served alike: float32)."""
    worst = 0.0
    for a16, a32 in zip(out16, out32, strict=True):
        if not (np.issubdtype(a16.dtype, np.floating) and np.issubdtype(a32.dtype, np.floating)):
            continue  # indices, masks: no rounding to measure
        b32 = np.asarray(a32, np.float64)
        if not np.isfinite(b32).all():
            return math.nan
        b16 = np.asarray(a16, np.float64)
        if not np.isfinite(b16).all():
            return math.inf
        diff, scale = float(np.abs(b16 - b32).max(initial=0.0)), float(np.abs(b32).max(initial=0.0))
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        worst = max(worst, rel)
    return worst


def probe_feed(engine: Engine) -> Feed:
    """The feed the probe runs: the image feed where the model has one, else its tensors."""
    return "image" if "image" in engine.feeds else "tensors"


def choose(engine: Engine, ctx: EngineContext, precision: str) -> Precision:
    """Load ``engine`` in the model's own dtype and say which and why (the module's rule):
    ``ctx`` is the executor's, ``precision`` the entry's (``auto``, ``float16``, ``float32``)."""
    if precision != "auto" or ctx.dtype != "float16":
        own = dataclasses.replace(ctx, dtype=ctx.dtype if precision == "auto" else precision)
        engine.load(own)
        dtype = engine.dtype_in(own)
        by: ChosenBy = "executor" if precision == "auto" else "entry"
        return Precision(dtype, by if dtype == own.dtype else "engine")
    half = dataclasses.replace(ctx, dtype="float16")
    if engine.dtype_in(half) != "float16":
        engine.load(ctx)
        return Precision(engine.dtype_in(ctx), "engine")
    stream = Stream("precision-probe", ctx.backend)  # its own: no batch's stream is touched
    try:
        verdict = probe(engine, half, stream)
    finally:
        stream.close()
    if verdict.dtype == "float32":
        engine.load(dataclasses.replace(ctx, dtype="float32"))
        logger.warning(
            "model %s serves in float32, not float16: %s", engine.model, verdict.reason()
        )
    else:
        if not engine.trial_loads:
            engine.load(half)
        logger.info("model %s serves in float16: %s", engine.model, verdict.reason())
    return verdict


def probe(engine: Engine, half: EngineContext, stream: Stream) -> Precision:
    """Run the probe's two trials (float32, then float16: left loaded) and judge them."""
    feed = probe_feed(engine)
    out32 = engine.trial(dataclasses.replace(half, dtype="float32"), feed, stream)
    try:
        with np.errstate(all="ignore"):  # an overflow is what the probe looks for
            out16 = engine.trial(half, feed, stream)
    except Exception as exc:  # float16 that does not run at all: served in float32
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
        return Precision("float32", "probe", None, why)
    err = fp16_error(out16, out32)
    return Precision("float16" if err <= FP16_TOLERANCE else "float32", "probe", err)
