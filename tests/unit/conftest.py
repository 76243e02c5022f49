"""Unit tests never start Ray: ``ray.init`` fails here. Time comes from a fake clock."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch):
    try:
        import ray
    except ImportError:  # pragma: no cover
        yield
        return

    def refuse(*args, **kwargs):
        raise RuntimeError("unit tests must not start Ray; put this test under tests/integration")

    monkeypatch.setattr(ray, "init", refuse)
    yield


class FakeClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
