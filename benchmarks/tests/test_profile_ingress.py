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
