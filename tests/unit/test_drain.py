"""deployments/drain.py: an ingress replica's drain, with a dict for Ray's key-value store."""

from __future__ import annotations

import pytest

from deployments.drain import LIVE_S, Drain, Report, drained, flag_key, report_prefix
from pipeline.errors import Unavailable


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _drain(store: dict, clock: Clock) -> Drain:
    return Drain("app", "r1", (store.get, store.__setitem__), retry_after_s=2.0, clock=clock)


def test_work_is_counted_and_refused_once_the_flag_is_up():
    store, clock = {}, Clock()
    d = _drain(store, clock)
    with d.work("a"):
        assert d.in_flight == 1
        d.poll()  # no flag: it keeps working, and says so
        assert Report.decode(store[report_prefix("app") + b"r1"]) == Report(False, 1, 1000.0)
        clock.t += 1
        store[flag_key("app")] = b"1000.500"
        d.poll()
        assert d.draining
        with pytest.raises(Unavailable) as e, d.work("b"):  # new work: 503, retry elsewhere
            pass
        assert e.value.reason == "draining" and e.value.retry_after_s == 2.0
        assert e.value.http_status == 503
    assert d.in_flight == 0  # the request it held finished
    d.poll()
    assert Report.decode(store[report_prefix("app") + b"r1"]) == Report(True, 0, 1001.0)


def test_a_flag_from_before_the_replica_started_is_an_earlier_stops():
    store, clock = {flag_key("app"): b"999.000"}, Clock()
    d = _drain(store, clock)  # started at 1000: the app was deployed again since
    d.poll()
    assert not d.draining
    with d.work():
        pass


def test_drained_waits_for_every_live_replica_and_ignores_gone_ones():
    flag = 100.0
    holding = [Report(True, 0, 101.0), Report(True, 3, 101.0)]
    assert not drained(holding, flag)
    unseen = [Report(True, 0, 101.0), Report(False, 0, 99.9)]  # one has not read the flag yet
    assert not drained(unseen, flag)
    gone = [Report(True, 0, 101.0), Report(False, 4, flag - LIVE_S - 1)]  # a replica long dead
    assert drained(gone, flag)
