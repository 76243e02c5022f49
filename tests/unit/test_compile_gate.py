"""The machine's compile gate (pipeline/engines/compile_gate.py), with real processes: the
first to come compiles alone, the others wait for it and then go on from its caches; a
finished key is not waited on; a holder that fails leaves no marker."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

from pipeline.engines.compile_gate import compile_gate


def _hold(directory: str, key: str, seconds: float, log: str) -> None:
    with compile_gate(key, directory) as first:
        start = time.time()
        time.sleep(seconds if first else 0.0)
        with open(log, "a") as f:
            f.write(f"{int(first)} {start:.3f} {time.time():.3f}\n")


def test_the_first_compiles_alone_and_the_others_start_once_it_is_done(tmp_path):
    log = str(tmp_path / "log")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_hold, args=(str(tmp_path), "k", 1.5, log)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = [line.split() for line in open(log).read().splitlines()]
    firsts = [r for r in rows if r[0] == "1"]
    others = [r for r in rows if r[0] == "0"]
    assert len(firsts) == 1 and len(others) == 2
    first_end = float(firsts[0][2])
    assert all(float(r[1]) >= first_end - 0.01 for r in others)  # none started before it ended


def test_a_finished_key_is_not_waited_on_and_a_failed_one_is_tried_again(tmp_path):
    with pytest.raises(RuntimeError), compile_gate("k", str(tmp_path)) as first:
        assert first
        raise RuntimeError("the compile failed")
    with compile_gate("k", str(tmp_path)) as first:  # no marker: this one compiles first
        assert first
    with compile_gate("k", str(tmp_path)) as first:
        assert not first
    with compile_gate("other", str(tmp_path)) as first:
        assert first


def test_a_process_that_compiles_from_the_caches_does_so_without_inductors_worker_pool(tmp_path):
    pytest.importorskip("torch")
    import torch._inductor.config as ic

    from pipeline.engines.compile_gate import torch_gate

    # (set and put back by hand: pytest's monkeypatch undoes with a delattr on torch's config
    # module, which leaves compile_threads missing for every later compile in the process)
    old, ic.compile_threads = ic.compile_threads, 16  # a 16-core node's default
    before = 16
    try:
        with torch_gate("k", str(tmp_path)) as first:  # the first: its pool as configured
            assert first and ic.compile_threads == before
        with torch_gate("k", str(tmp_path)) as first:  # after it: cache hits, in-process
            assert not first and ic.compile_threads == 1
        assert ic.compile_threads == before
    finally:
        ic.compile_threads = old
