"""soak.py's and overload.py's judgement on made-up samples (no Ray, no traffic): Triton's
memory-growth rule, the drift, the pulse's phases, the sections they write and render."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import overload, soak


def test_growth_is_max_after_warmup_minus_the_trimmed_mean_of_the_second_half():
    mb = 2**20
    flat = [(t, 500 * mb) for t in range(100)]
    assert soak.growth(flat, 10, 55)["growth_mb"] == 0.0
    # a start-up rise before the warm-up ends is not growth; one spike after it is
    rising = [(t, (100 if t < 5 else 500) * mb) for t in range(100)]
    assert soak.growth(rising, 10, 55)["growth_mb"] == 0.0
    spike = [(t, (650 if t == 30 else 500) * mb) for t in range(100)]
    assert soak.growth(spike, 10, 55)["growth_mb"] == pytest.approx(150.0)
    leak = [(t, (500 + 3 * t) * mb) for t in range(100)]  # 3 MB a sample
    g = soak.growth(leak, 10, 55)
    assert g["max_mb"] == 797.0 and g["growth_mb"] == 66.0  # 797 - the 2nd half's 731
    assert soak.trimmed_mean([1, 2, 3, 4, 5, 6, 7, 8, 9, 1000]) == pytest.approx(5.5)


def _args(**kw):
    base = dict(warmup_s=10, window_s=20, max_growth_mb=100, max_drift=0.2)
    return argparse.Namespace(**{**base, **kw})


def test_judge_flags_drift_unexpected_and_growth():
    book = soak.Book()
    good = soak.Req("classify m", "/p", b"", {}, (200,))
    bad = soak.Req("bad v2", "/p", b"", {}, (400,), True)
    t0 = 1000.0
    for i in range(100):
        book.rows.append((t0 + i, "classify m", 200, 10.0 if i < 55 else 13.0))
    book.add(bad, 400, 1.0, True, False)
    book.add(bad, 500, 1.0, True, False)  # a bad request must get its 4xx
    book.add(good, 503, 1.0, True, False)  # a 503 without Retry-After is no shed: unexpected
    book.add(good, 503, 1.0, True, True)  # the queue budget's 503: shed, counted apart
    book.add(good, 503, 1.0, False, True)  # ...but only with Ferry's JSON error
    rss = {"p": [(t0 + i, 400.0 * 2**20) for i in range(100)]}
    res = soak.judge(_args(), book, rss, {}, t0, t0 + 100)
    assert res["p99_drift"] == pytest.approx(0.3)
    assert res["pass"] == {"memory": True, "drift": False, "no_unexpected": False}
    assert res["unexpected"] == {
        "bad v2 -> 500": 1,
        "classify m -> 503": 1,
        "classify m -> 503 (not Ferry JSON)": 1,
    }
    assert res["shed_503"] == 1
    assert [w["from_s"] for w in res["windows"]] == [10, 30, 50, 70, 90]
    lines = soak.section(
        {"cpu": {**res, "label": "short check", "config": "c", "machine": "m", "clients": 8}}
    )
    assert "short check" in lines[2] and "no: drift, no_unexpected" in lines[2]


def test_pulse_split_by_when_each_request_was_sent(tmp_path):
    ev = tmp_path / "e.csv"
    start = 100.0
    lines = [f"{start},start,0,0,1,\n", f"{start + 0.2},start,0,0,1,\n"]  # master, a worker
    # period 30 s, bursts in [20, 30): answered at t, sent at t - ms/1000
    for t, status, ms in (
        (5, 200, 100),
        (25, 200, 300),
        (26, 503, 20),
        (21, 503, 40),
        (33, 200, 100),
        (45, 200, 120),
    ):
        lines.append(
            f"{start + t + ms / 1e3},classify,{status},{ms},1,{'1' if status == 503 else ''}\n"
        )
    ev.write_text("".join(lines) + "junk\n")
    s, rows = overload.read_events(str(ev))
    assert s == start and len(rows) == 6
    split = overload.pulse_split(s, rows, 30.0, 10.0, settle=5.0, duration=60.0)
    assert split["burst"]["accepted"] == 1 and split["burst"]["refused_503"] == 2
    assert split["burst"]["refusals_without_retry_after"] == 0
    assert split["base"]["accepted"] == 2  # t=5 (before the first burst) and 45; 33 settles
    res = {"steady": {"accepted_p99_ms": 150.0}, "pulse": split}
    assert overload.verdict(res) == {
        "unloaded_p99_ms": 150.0,
        "accepted_p99_in_bursts_ms": 300.0,
        "ratio": 2.0,
        "within_2x": True,
    }


def test_pulse_rates_count_the_windows_the_pulse_held():
    # a 90 s pulse, period 45, bursts in [30, 45) and [75, 90): 30 s of bursts, 50 s of base
    # (the first 30 s, then [55, 75) after a 10 s settle). Answers run past the end (in
    # flight at the stop); counting periods from the last answer made it 3 bursts, 45 s.
    assert overload.window_seconds(45.0, 15.0, 10.0, 90.0) == (30.0, 50.0)
    assert overload.window_seconds(45.0, 15.0, 10.0, 80.0) == (20.0, 50.0)
    start = 0.0
    rows = [(t / 10 + 0.05, "classify", 200, 50.0, 1, "", "") for t in range(0, 905)]
    split = overload.pulse_split(start, rows, 45.0, 15.0, 10.0, 90.0)
    assert split["burst"]["accepted_per_s"] == 10.0  # one answer every 0.1 s, as sent
    assert split["base"]["accepted_per_s"] == 10.0


def test_sections_merge_into_reliability_json(tmp_path):
    path = tmp_path / "rel.json"
    path.write_text(json.dumps({"strip_cost": {"rows": []}}))
    overload.write_section("overload", {"a": 1}, str(path))
    soak.write_section("cpu", {"b": 2}, str(path))
    soak.write_section("gpu", {"c": 3}, str(path))
    doc = json.loads(path.read_text())
    assert doc == {
        "strip_cost": {"rows": []},
        "overload": {"a": 1},
        "soak": {"cpu": {"b": 2}, "gpu": {"c": 3}},
    }


def test_a_new_overload_section_keeps_the_runs_it_replaces_as_repeats(tmp_path):
    path = tmp_path / "rel.json"
    run = {
        "verdict": {"unloaded_p99_ms": 80.0, "accepted_p99_in_bursts_ms": 140.0, "ratio": 1.75},
        "pulse": {"burst": {"accepted_per_s": 1000.0, "refused_503": 7}},
        "steady": {"refused_503": 1, "requests": 900},
    }
    old = {"date": "2026-12-01", "commit": "abc", "runs": {"budget": run}, "repeats": [{"x": 1}]}
    path.write_text(json.dumps({"overload_gpu": old}))
    overload.write_section("overload_gpu", {"date": "2026-12-02", "runs": {}}, str(path))
    doc = json.loads(path.read_text())["overload_gpu"]
    assert doc["date"] == "2026-12-02"
    assert doc["repeats"] == [
        {"x": 1},
        {
            "system": "budget",
            "date": "2026-12-01",
            "commit": "abc",
            "unloaded_p99_ms": 80.0,
            "accepted_p99_in_bursts_ms": 140.0,
            "ratio": 1.75,
            "accepted_per_s_in_bursts": 1000.0,
            "refused_in_bursts": 7,
            "refused_at_steady": "1 of 900",
        },
    ]
