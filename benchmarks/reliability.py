"""Reliability figures (issue 17) into results/reliability.json: what one pathological image
costs, and what 1,000 stalled uploads do to health and classify on the CPU default.

    python benchmarks/reliability.py      # starts a local Ray cluster (about a minute)

Faults, chaos and drain: benchmarks/reliability_chaos.py (its own sections of the same
file, kept here). Each figure comes from the same code the tests assert on: tests/unit/
test_bounded_decode.py's measuring subprocess and tests/integration/test_slow_clients.py.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks.common import read_results, write_results  # noqa: E402


def strip_cost() -> list[dict]:
    from pipeline.imaging import encode_jpeg, encode_png
    from tests.unit.test_bounded_decode import _MEASURE

    rows = []
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        for shape in ((1, 60000), (60000, 1), (1, 10000)):
            img = rng.integers(0, 255, (*shape, 3), dtype=np.uint8)
            for name, enc in (("png", encode_png), ("jpeg", encode_jpeg)):
                path = os.path.join(d, f"s.{name}")
                with open(path, "wb") as f:
                    f.write(enc(img))
                r = subprocess.run(
                    [sys.executable, "-c", _MEASURE, path],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    check=True,
                )
                got = json.loads(r.stdout.strip().splitlines()[-1])
                work = got["work"][0]  # what the decoder was asked to make, counted in it
                rows.append(
                    {
                        "image": f"{shape[1]}x{shape[0]} {name}",
                        "decoded_mpx": round(work["decoded_px"] / 1e6, 3),
                        "decoded_mb": round(work["decoded_bytes"] / 2**20, 2),
                        "peak_rss_growth_mb": round(got["peak_growth_kb"] / 1024, 1),
                    }
                )
    return rows


def slow_clients() -> dict:
    out = os.path.join(tempfile.mkdtemp(), "slow.json")
    env = {**os.environ, "FERRY_SLOW_CLIENT_JSON": out}
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "tests/integration/test_slow_clients.py"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    with open(out) as f:
        return json.load(f)


def main() -> int:
    path = os.path.join(HERE, "results", "reliability.json")
    doc = read_results(path)  # reliability_chaos.py's sections stay
    doc |= {
        "machine": f"{platform.node()}: {os.cpu_count()} cores, no GPU",
        "date": datetime.date.today().isoformat(),
        "strip_cost": {
            "method": "a fresh process decodes the image to ResNet-50's input (224x224 centre "
            "crop); the pixels and bytes the decoder made (counted in its calls) and the "
            "process's peak RSS after the decode minus before (imports already done)",
            "rows": strip_cost(),
        },
        "slow_clients": {
            "method": "CPU test app (serve_config.yaml's ingress max_ongoing_requests 2048), "
            "ingress.max_concurrent_uploads 64, body_idle_timeout_s 3, upload_grace_s 1: 1,000 "
            "connections declare a 1,000-byte body and send 10 bytes (20 every 0.5 s, over 25 s) "
            "while one client alternates GET /v2/health/ready and a digits classify",
            **slow_clients(),
        },
    }
    write_results(path, doc)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
