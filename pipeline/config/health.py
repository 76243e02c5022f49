"""What makes a replica that owns an executor fail its health check (the checks themselves
are ``pipeline/health.py``'s)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class HealthConfig(BaseModel):
    """What makes a replica that owns an executor report itself unhealthy."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    stall_after_s: float = Field(60.0, gt=0.0, le=3600.0)
    """Work queued or in flight and no batch finished for this long: the scheduler is wedged
    (keep it above the longest batch the slowest bucket takes)."""
    probe_device: bool = True
    """Each health check also asks the device for its memory info, which fails on a lost
    or poisoned CUDA context (nothing waits on the GPU's queue)."""
    retry_after_s: float = Field(1.0, ge=0.0, le=600.0)
    """Retry-After of the 503 a draining replica answers new work with."""
