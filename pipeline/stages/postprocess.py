"""The postprocess stage (``PostprocessStage``): logits -> softmax -> top-k with labels (classify), or probability/logit
tensors (Open Inference Protocol), or a task's answer -- an encoded image, a class mask, boxes
(``pipeline.tasks.answers``) -- one answer per request of the call."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from pipeline import metrics
from pipeline.config import PipelineConfig
from pipeline.errors import FerryError, InvalidInput, NonFiniteOutput
from pipeline.models.repository import model_card
from pipeline.ops import SOFTMAX, TOPK
from pipeline.ops.base import eager
from pipeline.ops.softmax import softmax_rows, top_k_rows
from pipeline.tasks.answers import KINDS, Made, TaskContext, answer_tasks
from pipeline.tasks.spec import anchors_of
from pipeline.threads import thread_pool

from .messages import Answer, Logits, PostSpec, Timings


def _non_finite_rows(logits: Logits) -> set[int]:
    """The rows any of whose outputs holds a NaN or an infinity."""
    bad: set[int] = set()
    if logits.finite is not None:  # the epilogue's word on the float output it read
        bad.update(int(i) for i in np.flatnonzero(logits.finite == 0))
    for out in (logits.data, *logits.more):
        if out is None or not np.issubdtype(out.dtype, np.floating):
            continue
        finite = np.isfinite(out.reshape(len(out), -1)).all(axis=1)
        if not finite.all():
            bad.update(int(i) for i in np.flatnonzero(~finite))
    return bad


def _v2_outputs(
    logits: Logits, spec: PostSpec, rows: list[int], probs: np.ndarray | None
) -> dict[str, np.ndarray]:
    """A v2 request's outputs by name: the model's own, and ``probabilities`` (the softmax
    of the first) where the model has no output of that name."""
    tensors = {}
    own = dict(zip(spec.names, (logits.data, *logits.more), strict=False))
    for name in spec.outputs:
        if name == "probabilities" and name not in own:
            tensors[name] = probs[rows]
        else:
            tensors[name] = own[name][rows]
    return tensors


def _unranked(model: str, logits: Logits) -> InvalidInput:
    shape = [] if logits.data is None else list(logits.data.shape[1:])
    return InvalidInput(
        "the model's output has no classes to rank: classify needs an [N, classes] output",
        model=model,
        output=[-1, *shape],
        hint="its task is another route's: /image, /segment, /detect, or v2",
    )


class PostprocessStage:
    """Softmax, top-k and the answers; no Ray (the Postprocess deployment wraps it, the
    inference stage runs it in place where it answers itself)."""

    def __init__(self, config: PipelineConfig, device: Any = None) -> None:
        """``device``: the answerer that resizes and encodes JPEG answers on the GPU
        (``tasks.encode_device.DeviceAnswers``), where this stage runs beside the executor."""
        self.cards = {m.name: model_card(m) for m in config.models}
        # named in a non-finite output's error: the entry's precision, else the executor's
        # dtype (a model that ``auto`` kept in float16 passed the precision probe at load)
        self.dtypes = {
            m.name: config.executor.dtype if m.precision == "auto" else m.precision
            for m in config.models
        }
        self.tasks = TaskContext(
            {name: card.label for name, card in self.cards.items()},
            {m.name: anchors_of(m) for m in config.models},
            # the encoders' threads (made at the first image answered)
            None,
            device,
        )
        self._threads = max(1, config.preprocess.threads)

    def _task_answers(
        self, logits: Logits, specs: list[PostSpec], rows_of: dict[int, list[int]], bad: set[int]
    ) -> dict[int, Made | FerryError]:
        """The answers of the call's task requests (image, segment, detect)."""
        if not any(s.kind in KINDS for s in specs) or logits.data is None:
            return {}
        if self.tasks.pool is None:
            self.tasks.pool = thread_pool(self._threads, "ferry-encode")
        skip = set(logits.errors) | {r for r, rows in rows_of.items() if bad & set(rows)}
        outputs = (logits.data, *logits.more)
        on_device = logits.finite is not None  # the epilogue's bytes, not the model's floats
        return answer_tasks(self.tasks, outputs, specs, rows_of, skip, on_device)

    def run(self, model: str, logits: Logits, specs: list[PostSpec]) -> list[Answer | FerryError]:
        t0 = time.perf_counter()
        card = self.cards[model]
        bad = _non_finite_rows(logits)
        probs = vals = idx = None
        classes = 0 if logits.data is None else int(logits.data.shape[-1])
        rows_of = logits.rows_by_request()
        made = self._task_answers(logits, specs, rows_of, bad)
        ranked = logits.data is not None and logits.data.ndim == 2
        if ranked and any(s.kind in ("classify", "v2") for s in specs):  # (softmax: rank 2)
            # on the host, the ops' kernels called as they are (no plan, stream or buffers
            # made a call: on the loop, a call's answers are its own cost)
            host = isinstance(logits.data, np.ndarray) and logits.data.dtype.kind == "f"
            (probs,) = (softmax_rows(logits.data),) if host else eager(SOFTMAX, logits.data)
            # one top-k over every row, as deep as the deepest request asks (the order is a
            # stable sort, so a shallower request's top-k is a prefix of it)
            kmax = max((s.top_k for s in specs if s.kind == "classify"), default=0)
            if kmax:
                kmax = min(kmax, classes)
                vals, idx = (
                    top_k_rows(probs, kmax, own=True) if host else eager(TOPK, probs, k=kmax)
                )
                vals, idx = vals.tolist(), idx.tolist()
        out: list[Answer | FerryError] = []
        for r, spec in enumerate(specs):
            if r in logits.errors:
                out.append(logits.errors[r])
                continue
            rows = rows_of.get(r, [])
            if bad and any(row in bad for row in rows):  # no NaN ever reaches an answer
                out.append(
                    NonFiniteOutput(
                        "the model's output is not finite (NaN or infinity)",
                        model=model,
                        dtype=self.dtypes.get(model, "auto"),
                        fix="serve it in float32: precision: float32 in the model's entry",
                    )
                )
                continue
            a = self._answer(logits, rows)
            if spec.kind in KINDS:
                m = made[r]
                if isinstance(m, FerryError):
                    out.append(m)
                    continue
                a.media, a.media_type, a.result = m.media, m.media_type, m.result
            elif spec.kind == "classify" and not ranked:
                out.append(_unranked(model, logits))
                continue
            elif spec.kind == "classify":
                row = rows[0]
                a.top_k = [
                    {"label": card.label(i), "class": i, "score": v}
                    for v, i in zip(vals[row][: spec.top_k], idx[row][: spec.top_k], strict=True)
                ]
            else:
                a.outputs = _v2_outputs(logits, spec, rows, probs)
            out.append(a)
        ms = (time.perf_counter() - t0) * 1e3
        metrics.observe_stage("postprocess", model, ms, len(out))
        for a in out:
            if isinstance(a, Answer):
                a.timings.postprocess = ms
        return out

    @staticmethod
    def _answer(logits: Logits, rows: list[int]) -> Answer:
        """A request's answer, its timings so far: the call's decoding, and the slowest of
        its rows' queue and GPU times."""
        t = Timings(preprocess=logits.preprocess_ms)
        rt = logits.row_times
        bs = 0
        if rows and rt.gpu:
            t.queue = max(rt.queue[i] for i in rows)
            t.gpu = max(rt.gpu[i] for i in rows)
            bs = max(rt.batch_size[i] for i in rows)
        return Answer(t, batch_size=bs, random_weights=logits.random_weights)

    def check_health(self) -> None:
        """Healthy while the process lives: postprocessing is a pure function of its input: there is nothing to wedge."""
