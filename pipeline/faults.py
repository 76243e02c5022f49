"""Fault injection for the executor: off by default, for tests and chaos runs.

A fault hits the executor's batches from its ``at_batch``-th one on (counted from the
first batch after warm-up, 1-based), ``times`` batches long:

- ``device_error``: the batch's commit raises ``DeviceError`` as a lost CUDA context
  would -- and, like one, every later commit and device probe too (the device stays
  poisoned whatever ``times`` says), so the replica's ``check_health`` fails;
- ``oom_reserve``: the batch's arena reservation fails with ``ResourceExhausted``, before
  any work starts;
- ``oom_commit``: an out-of-memory error in the middle of the batch, after its arena and
  staging slot are taken and its rows copied in;
- ``stall``: the batch's completion waits ``stall_s`` seconds (a hung kernel): nothing
  finishes meanwhile, so the scheduler is wedged with work queued.

``warmup_delay_s`` makes warm-up that much longer (readiness tests). Configured under
``executor.faults``, or from the environment: ``FERRY_FAULTS`` holds the same fields as
JSON and wins over the config, e.g.
``FERRY_FAULTS='{"faults": [{"kind": "device_error", "at_batch": 20}]}'``.
"""

from __future__ import annotations

import json
import threading
import time

from .config.faults import FaultConfig  # re-exported: the model lives in the config
from .errors import DeviceError, ResourceExhausted


def resolve(config: FaultConfig, env_json: str | None) -> FaultConfig:
    """The faults in force: ``FERRY_FAULTS`` (JSON) when set, else the config's."""
    if not env_json:
        return config
    return FaultConfig.model_validate(json.loads(env_json))


class Injector:
    """Decides, per batch, which faults hit it; thread-safe (batches are prepared from
    several threads). ``armed`` is false during warm-up: warm-up batches are not counted."""

    def __init__(self, config: FaultConfig) -> None:
        self.config = config
        self.armed = False
        self.poisoned: DeviceError | None = None
        self._n = 0
        self._lock = threading.Lock()
        self.injected: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def next_batch(self) -> frozenset[str]:
        """The kinds that hit the batch being prepared now (raising for ``oom_reserve``)."""
        if not self.config.faults or not self.armed:
            return frozenset()
        with self._lock:
            self._n += 1
            n = self._n
            kinds = frozenset(f.kind for f in self.config.faults if f.hits(n))
            for k in kinds:
                self.injected[k] = self.injected.get(k, 0) + 1
        if "oom_reserve" in kinds:
            raise ResourceExhausted(
                "out of device memory (injected)", injected=True, batch=n, retry_after_s=1
            )
        return kinds

    def on_commit(self, kinds: frozenset[str]) -> None:
        """Raise what hits the batch while it is enqueued (its arena and slot are held)."""
        if "device_error" in kinds and self.poisoned is None:
            self.poisoned = DeviceError(
                "CUDA error: an illegal memory access was encountered (injected)", injected=True
            )
        if self.poisoned is not None:
            raise self.poisoned
        if "oom_commit" in kinds:
            raise MemoryError("out of memory allocating a batch workspace (injected)")

    def stall_s(self, kinds: frozenset[str]) -> float:
        if "stall" not in kinds:
            return 0.0
        return max(f.stall_s for f in self.config.faults if f.kind == "stall")

    def warmup_delay(self) -> None:
        if self.config.warmup_delay_s > 0:
            time.sleep(self.config.warmup_delay_s)
