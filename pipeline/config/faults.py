"""Which faults the executor injects (tests and chaos runs): ``executor.faults``, or
``FERRY_FAULTS`` as JSON. What each fault does, and the injector, are ``pipeline/faults.py``'s."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Kind = Literal["device_error", "oom_reserve", "oom_commit", "stall"]


class Fault(BaseModel):
    """One injected fault."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    kind: Kind
    """What fails: ``device_error``, ``oom_reserve``, ``oom_commit`` or ``stall``."""
    at_batch: int = Field(1, ge=1, le=10_000_000)
    """The first batch it hits, counted from the first after warm-up (1-based)."""
    times: int = Field(1, ge=0, le=10_000_000)
    """How many consecutive batches it hits; 0: every batch from ``at_batch`` on."""
    stall_s: float = Field(3600.0, ge=0.0, le=86_400.0)
    """How long a ``stall`` holds the batch's completion."""

    def hits(self, ordinal: int) -> bool:
        if ordinal < self.at_batch:
            return False
        return self.times == 0 or ordinal < self.at_batch + self.times


class FaultConfig(BaseModel):
    """Fault injection (tests and chaos runs only): empty, nothing is injected."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    faults: tuple[Fault, ...] = ()
    """The faults to inject; none by default."""
    warmup_delay_s: float = Field(0.0, ge=0.0, le=3600.0)
    """Extra seconds of warm-up (to observe a replica that is not ready yet)."""

    @property
    def enabled(self) -> bool:
        return bool(self.faults) or self.warmup_delay_s > 0
