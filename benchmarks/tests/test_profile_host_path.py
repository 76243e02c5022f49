"""profile_host_path's tiny model on the CPU: the bench_models loop through the executor, its
answers the model's (a 4x4 image pooled to 3 logits), and the step's cost printed."""

from __future__ import annotations

import numpy as np

from benchmarks import profile_host_path as P
from pipeline.config import ExecutorConfig
from pipeline.executor import GpuExecutor


def test_tiny_model_answers_the_pooled_image(tmp_path):
    ex = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 4), pool_limit_fraction=0.01))
    try:
        ex.load_entry(P.tiny_entry(str(tmp_path)))
        ex.warmup()
        u8 = np.random.default_rng(0).integers(0, 256, (3, 4, 4, 3), dtype=np.uint8)
        got = ex.infer("tiny", u8)
        want = (u8 / 255.0).mean(axis=(1, 2))  # pooled per channel: [N, 3]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    finally:
        ex.close()


def test_tiny_profile_prints_the_cost_a_step(capsys):
    assert P.main(["--model", "tiny", "--steps", "60", "--no-profile"]) == 0
    out = capsys.readouterr().out
    assert "tiny batch 1 (spin): 60 steps," in out and "us CPU a step" in out
    # every step ran the model once (the 300 warm-up steps count too: facts start before them)
    assert "'eager_runs_timed': 360" in out
