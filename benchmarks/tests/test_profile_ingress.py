"""profile_ingress.py builds the CPU default's one-process ingress in this process and drives
real digit PNGs through its ASGI app: every request answered, and the profile it prints
covers the request's own path (the ingress's handler), not only the loop's idle polling."""

import ast

from benchmarks import profile_ingress


def test_profile_ingress_answers_and_profiles_the_request_path(capsys):
    rc = profile_ingress.main(["--seconds", "0.5", "--clients", "8", "--top", "200"])
    out = capsys.readouterr().out
    assert rc == 0, out
    head = ast.literal_eval(out.splitlines()[0])  # the summary dict it prints first
    assert head["ok"] > 0 and head["bad"] == 0
    assert head["loop_cpu_ms_per_request"] > 0
    assert "deployments/ingress.py" in out and "(by_image)" in out
    threads = head["threads_cpu_ms_per_request"]
    assert "ferry-loop" in threads  # the loop names its thread at the first classify request
    assert head["process_cpu_ms_per_request"] >= max(threads.values()) > 0


def test_a_system_of_bench_e2e_is_profiled_with_its_sets(tmp_path):
    """``--system``: the replica's config of a bench_e2e system, its sets and --set's applied;
    a peer (no Ferry ingress) is refused."""
    import os

    import pytest
    import yaml

    path = profile_ingress.system_config("ferry_torch_dyn", ["ingress.coalesce_window_ms=0.5"])
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f)["applications"][0]["args"]["config"]
    finally:
        os.unlink(path)
    assert cfg["models"][0]["compile"] == "dynamic"
    assert cfg["preprocess"]["decode_rounds"] == 2
    assert cfg["ingress"]["coalesce_window_ms"] == 0.5
    with pytest.raises(SystemExit, match="not a Ferry system"):
        profile_ingress.system_config("rayserve_expert_8", [])
