"""The ingress's readiness: answered at once, and with why when it is not ready.

Ready means the inference stage says so (its replica warm, not draining, not poisoned), as
the ingress last learned by asking it (``status``). Asking runs in a task of its own (a
*probe*): every ``POLL_S`` from the ingress's start until the answer is ready (then no more
-- no call every few seconds in the inference replica's log), and whenever a readiness
request finds no answer younger than ``FRESH_S``; a request waits for the probe in flight at
most ``ANSWER_S``, then answers with what is known. (It used to ask inline with a 2 s timeout: while the inference
replica was still loading, every readiness request hung that long for a bare ``false``.)

While the inference deployment does not answer -- its replica loading its models, or failing
to start -- the ``why`` comes from what it last published (``load_board``): ``warming: 1 of
2 models loaded; loading resnet50``, or the models it refused and their reasons. Models
refused at load are kept here (``refused``), so that their requests are answered 503
``ModelUnavailable`` at once, without a hop -- also while Serve is still starting a replica
that will refuse them again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pipeline.errors import FerryError, Unavailable
from pipeline.models.loading import ModelUnavailable

from .load_board import why_of

logger = logging.getLogger(__name__)
POLL_S = 1.0  # how often the probe runs while not ready
FRESH_S = 2.0  # a "ready" younger than this is answered without asking again
ANSWER_S = 0.5  # how long a readiness request waits for a probe in flight
PROBE_TIMEOUT_S = 10.0  # a probe that has no answer by then is given up
_now = time.monotonic  # (the tests' clock)
UNANSWERED_S = 2.0  # a ready stage whose probe has had no answer this long is not ready:
# its replicas are gone (a node lost: Ray tells the callers only ~15 s later) or wedged


class Readiness:
    """``status``: asks the inference stage (``ingress_route``'s ``status``); ``board``:
    reads its load report (None: no board); ``draining``: whether the app is stopping."""

    def __init__(
        self,
        status: Callable[[], Awaitable[dict[str, Any]]],
        board: Callable[[], dict[str, Any] | None] | None,
        draining: Callable[[], bool],
    ) -> None:
        self.status, self.board, self.draining = status, board, draining
        self.ready = False
        self.why = "starting: the inference deployment has not answered yet"
        self.refused: dict[str, str] = {}  # model -> why it is not served
        self.precision: dict[str, dict[str, Any]] = {}  # model -> its compute dtype and why
        self._confirmed = float("-inf")  # when ready was last confirmed (monotonic)
        self._probe: asyncio.Task | None = None
        self._probe_since = float("-inf")  # when the probe in flight was sent (monotonic)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Probe in the running event loop until ready (nothing without a loop)."""
        if self._task is None or (self._task.done() and not self.ready):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._task = loop.create_task(self._run())

    async def _run(self) -> None:
        while not self.ready:
            try:
                await self.refresh()
            except Exception as exc:  # never let the loop die: the next round tries again
                logger.debug("readiness probe failed: %s", exc)
            if not self.ready:
                await asyncio.sleep(POLL_S)

    async def answer(self) -> tuple[bool, str | None]:
        """(ready, why not) -- within ``ANSWER_S``."""
        self.start()
        if self.draining():  # the app is being stopped: send new work elsewhere
            return False, "draining: the application is being stopped"
        if not (self.ready and _now() - self._confirmed < FRESH_S):
            await self.refresh()
        return self.ready, None if self.ready else self.why

    async def refresh(self) -> None:
        """Probe (or join the probe in flight) for at most ``ANSWER_S``; while it has no
        answer, a ready replica stays ready for ``UNANSWERED_S`` (a busy one may answer
        slowly) and a not-ready one's why comes from the board."""
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._ask())
            self._probe_since = _now()
        done, _ = await asyncio.wait({self._probe}, timeout=ANSWER_S)
        if done:
            return
        if not self.ready:
            await self._from_board(None)
        elif _now() - self._probe_since >= UNANSWERED_S:
            self.ready, self._confirmed = False, float("-inf")
            self.why = (
                f"unavailable: the inference deployment has not answered for "
                f"{UNANSWERED_S:.0f} s (its replicas lost or wedged)"
            )

    async def _ask(self) -> None:
        try:
            status = await asyncio.wait_for(self.status(), PROBE_TIMEOUT_S)
        except Exception as exc:  # no replica answers (starting, failed, gone)
            await self._from_board(exc)
            return
        health = status.get("health") or {}
        self.refused = dict(status.get("refused") or {})
        self.precision = {
            m: s["precision"]
            for m, s in (status.get("models") or {}).items()
            if isinstance(s, dict) and s.get("precision")
        }
        if health.get("ready", True):
            self.ready, self.why = True, None
            self._confirmed = _now()
        else:
            self.ready = False
            self.why = f"{health.get('state', 'unhealthy')}: {health.get('reason') or 'not ready'}"

    async def _from_board(self, exc: BaseException | None) -> None:
        report = None
        if self.board is not None:
            try:
                report = await asyncio.to_thread(self.board)
            except Exception as board_exc:
                logger.debug("reading the load report failed: %s", board_exc)
        self.ready = False
        self._confirmed = float("-inf")
        if report is not None:  # refusals add up over a replica's tries, until one answers
            self.refused.update(report.get("refused") or {})
        if report is None and exc is not None and not isinstance(exc, asyncio.TimeoutError):
            self.why = f"unavailable: the inference deployment does not answer ({exc_name(exc)})"
        else:
            self.why = why_of(report)

    async def server(self) -> tuple[dict[str, Any], int]:
        """``/v2/health/ready``'s body and status: ready or why not, and the models refused
        at load either way (ready while any model is served, as Triton without
        ``--strict-readiness``)."""
        ok, why = await self.answer()
        body: dict[str, Any] = {"ready": ok} if why is None else {"ready": ok, "why": why}
        if self.refused:
            body["refused"] = dict(self.refused)
        return body, 200 if ok else 503

    async def model(self, name: str, base: str) -> tuple[dict[str, Any], int]:
        """``/v2/models/{name}/ready`` (``base``: the model it runs)."""
        ok, why = await self.answer()
        if base in self.refused:
            ok, why = False, "refused: " + self.refused[base]
        body: dict[str, Any] = {"name": name, "ready": ok}
        if why is not None:
            body["why"] = why
        return body, 200 if ok else 503

    # ------------------------------------------------------------------ models
    def check(self, model: str) -> None:
        """``ModelUnavailable`` (503, not retryable) when ``model`` was refused at load."""
        reason = self.refused.get(model)
        if reason is not None:
            raise ModelUnavailable(model=model, reason=reason)

    async def not_loaded(self, model: str) -> None:
        """A model the inference stage has no engine of: its refusal, once a probe has
        told it."""
        await self.refresh()
        self.check(model)
        raise ModelUnavailable(model=model, reason="the inference replica has not loaded it")

    def explain(self, model: str, err: BaseException) -> BaseException:
        """A downstream failure as the model's refusal, where it is one: a replica lost
        under a request (``Unavailable``) of a model the replicas refuse is no retry's
        matter."""
        if isinstance(err, Unavailable) and model in self.refused:
            try:
                self.check(model)
            except FerryError as refusal:
                return refusal
        return err

    def state_of(self, model: str) -> dict[str, Any]:
        """``/v1/models``'s view: ``ready``, ``refused`` (with the reason) or ``starting``,
        and the compute dtype the inference replica chose for it at load (``precision``)."""
        if model in self.refused:
            return {"state": "refused", "reason": self.refused[model]}
        out: dict[str, Any] = {"state": "ready" if self.ready else "starting"}
        if model in self.precision:
            out["precision"] = self.precision[model]
        return out


def exc_name(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    return type(cause).__name__
