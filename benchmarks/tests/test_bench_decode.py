"""bench_decode.py on this machine's CPU: the real CPU stage on bench_e2e's corpora, a row a
corpus, batch size and thread count, with the ratios of each row to its own baseline (and
of a GPU row to the peer's, given rows as a GPU run writes them)."""

from __future__ import annotations

import json
import sys

from benchmarks import bench_decode, decode_rows


def test_a_cpu_run_has_a_row_per_corpus_batch_and_threads(tmp_path, monkeypatch):
    out = tmp_path / "decode.json"
    argv = ["bench_decode.py", "--out", str(out), "--seconds", "0.05", "--corpus",
            "chelsea,photos", "--batches", "2,5", "--threads", "1,2", "--no-peer"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    assert bench_decode.main() == 0
    doc = json.loads(out.read_text())
    keys = [(r["corpus"], r["batch"], r["path"]) for r in doc["rows"]]
    assert keys == [
        (c, b, f"cpu_simplejpeg_{t}t")
        for c in ("chelsea", "photos")
        for b in (2, 5)
        for t in (1, 2)
    ]
    for r in doc["rows"]:
        assert r["img_s"] > 0 and r["cpu_ms_per_img"] > 0
        if r["path"] == "cpu_simplejpeg_1t":
            assert r["img_s_vs_cpu_1t"] == 1.0
    assert "chelsea:" in doc["image"] and "photos:" in doc["image"]
    assert doc["complete"] is True


def test_each_row_is_saved_as_it_is_measured(tmp_path, monkeypatch):
    """A run cut short (the device call's time limit) keeps the rows it measured: the JSON
    is written after each row, ``complete`` false until the last."""
    out = tmp_path / "decode.json"
    seen = []
    write = bench_decode.write_json

    def spy(path, payload):
        write(path, payload)
        seen.append((len(payload["rows"]), payload["complete"]))

    monkeypatch.setattr(bench_decode, "write_json", spy)
    argv = ["bench_decode.py", "--out", str(out), "--seconds", "0.05", "--corpus", "chelsea",
            "--batches", "2", "--threads", "1,2", "--no-peer"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    assert bench_decode.main() == 0
    assert seen == [(1, False), (2, False), (2, True)]
    doc = json.loads(out.read_text())
    assert doc["rows"][1]["img_s_vs_cpu_1t"] > 0  # the ratios are in every save


def test_ratios_pair_rows_of_the_same_corpus_and_batch():
    rows = [
        {"path": "cpu_simplejpeg_1t", "corpus": "photos", "batch": 4, "img_s": 100.0,
         "cpu_ms_per_img": 4.0},
        {"path": "cpu_simplejpeg_1t", "corpus": "photos", "batch": 64, "img_s": 50.0,
         "cpu_ms_per_img": 2.0},
        {"path": "gpu_auto", "corpus": "photos", "batch": 4, "img_s": 1000.0,
         "cpu_ms_per_img": 0.5},
        {"path": "peer_torchvision", "corpus": "photos", "batch": 4, "img_s": 2000.0,
         "cpu_ms_per_img": 0.2},
        {"path": "gpu_auto", "corpus": "photos", "batch": 64, "img_s": 3000.0,
         "cpu_ms_per_img": 0.1},
    ]  # fmt: skip
    decode_rows.ratios(rows)
    assert rows[2]["img_s_vs_cpu_1t"] == 10.0 and rows[2]["cpu_ms_vs_cpu_1t"] == 0.125
    assert rows[2]["img_s_vs_peer"] == 0.5
    assert rows[4]["img_s_vs_cpu_1t"] == 60.0
    assert "img_s_vs_peer" not in rows[4]  # no peer row at batch 64
    assert "img_s_vs_peer" not in rows[3]  # the peer is not compared with itself


def test_ratios_pair_n_processes_with_the_peer_in_as_many():
    rows = [
        {"path": p, "corpus": "chelsea", "batch": 32, "img_s": v, "cpu_ms_per_img": 1.0}
        for p, v in [("peer_torchvision", 1000.0), ("peer_torchvision_x8p", 4000.0),
                     ("gpu_auto", 3000.0), ("gpu_auto_x8p", 6000.0),
                     ("gpu_auto_x8p_sleep", 2000.0), ("gpu_auto_r2_x8p", 8000.0),
                     ("gpu_auto_r2", 500.0)]
    ]  # fmt: skip
    decode_rows.ratios(rows)
    assert rows[2]["img_s_vs_peer"] == 3.0
    assert rows[3]["img_s_vs_peer"] == 1.5 and rows[4]["img_s_vs_peer"] == 0.5
    assert rows[5]["img_s_vs_peer"] == 2.0 and rows[6]["img_s_vs_peer"] == 0.5  # (two rounds)
    del rows[1]
    for r in rows:
        r.pop("img_s_vs_peer", None)
    decode_rows.ratios(rows)
    assert "img_s_vs_peer" not in rows[2]  # no 8-process peer row: no ratio


def test_processes_at_once_start_together_and_sum_their_rates():
    # the CPU stage stands in for the GPU's (the same path through _many_rate)
    rate, cpu_ms, n = bench_decode._many_rate("cpu_1t", "chelsea", 2, 0.3, 2)
    assert n >= 2 * 2 and rate > 0 and cpu_ms > 0
