"""Load shapes as plain logic (no locust import, so they are testable anywhere).

Each ``tick(run_time, stats)`` returns ``(users, spawn_rate, weights)`` -- ``weights`` maps
user-class names to their share, or ``None`` -- or ``None`` to stop. ``stats`` carries the
current ``p99_ms`` and ``fail_ratio``. The locustfile wraps them in ``LoadTestShape``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepRamp:
    """Concurrency doubles every ``step_s`` until p99 or errors break a threshold (or max)."""

    start_users: int = 1
    step_s: float = 20.0
    max_users: int = 1024
    p99_limit_ms: float = 1000.0
    fail_limit: float = 0.01
    _stopped_at: float | None = field(default=None, init=False)

    def tick(self, run_time: float, stats: dict) -> tuple[int, float, None] | None:
        step = int(run_time // self.step_s)
        users = self.start_users * 2**step
        # judge the step that just ended, from its second half on
        if (
            step > 0
            and run_time % self.step_s < 1.0
            and (
                stats.get("p99_ms", 0) > self.p99_limit_ms
                or stats.get("fail_ratio", 0) > self.fail_limit
            )
        ):
            self._stopped_at = run_time
            return None
        if users > self.max_users:
            return None
        return users, float(users), None


@dataclass
class Pulse:
    """A sustained level with bursts of ``factor`` times it for ``burst_s``, every ``period_s``."""

    users: int = 64
    factor: float = 3.0
    burst_s: float = 60.0
    period_s: float = 180.0
    duration_s: float = 600.0

    def tick(self, run_time: float, stats: dict) -> tuple[int, float, None] | None:
        if run_time >= self.duration_s:
            return None
        in_burst = (run_time % self.period_s) >= self.period_s - self.burst_s
        n = round(self.users * self.factor) if in_burst else self.users
        return n, float(max(n, 1)), None


@dataclass
class SlowClients:
    """``users`` clients of which a ``slow_share`` upload at a throttled rate."""

    users: int = 64
    slow_share: float = 0.25
    duration_s: float = 300.0

    def tick(self, run_time: float, stats: dict) -> tuple[int, float, dict[str, float]] | None:
        if run_time >= self.duration_s:
            return None
        return (
            self.users,
            float(self.users),
            {"SlowUploadUser": self.slow_share, "ClassifyUser": 1 - self.slow_share},
        )


def make(
    name: str, seconds: float | None = None, users: int | None = None
) -> StepRamp | Pulse | SlowClients:
    """The shape ``name`` (step, pulse, slow) for a run of ``seconds`` (``None``: the
    shape's own schedule). A pulse keeps its rhythm within the run: a period of at most half
    of it (so at least one burst comes), a third of each period the burst; ``users`` its
    sustained level (64 unless given)."""
    if name == "step":
        return StepRamp()
    if name == "pulse":
        base = Pulse() if users is None else Pulse(users=users)
        if seconds is None:
            return base
        period = min(180.0, seconds / 2)
        return Pulse(base.users, period_s=period, burst_s=period / 3, duration_s=seconds)
    if name == "slow":
        return SlowClients() if seconds is None else SlowClients(duration_s=seconds)
    raise ValueError(f"no load shape {name!r}: step, pulse or slow")


def limited(run_time: float, limit_s: float | None) -> bool:
    """Whether a run limited to ``limit_s`` seconds (``--run-time``, FERRY_SHAPE_SECONDS)
    is over."""
    return limit_s is not None and run_time >= limit_s
