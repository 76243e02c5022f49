"""Gauges of an idle process on Ray's metrics endpoint, for ``test_02_idle_gauges.py``.

A Ray actor records Ferry's gauges once (``pipeline.metrics`` with Ray's own metric classes,
as a process outside Serve has them): a queue depth, the executor's counts, a stage
histogram; and beside them one plain Ray gauge, set once. Then nothing records for
``IDLE_S``, while the node's endpoint is read every ``EVERY_S``: which of them it shows,
when. Prints the record as one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ray  # noqa: E402

from benchmarks import ray_probe  # noqa: E402

INTERVAL_MS = 2000  # Ray's report interval here (its default is 10 s: the wait would be 5x)
IDLE_S = 36.0
EVERY_S = 2.0
SERIES = {
    "queue": ("ray_ferry_queue_depth", 3.0),
    "executor": ("ray_ferry_executor_eager_runs", 5.0),
    "histogram": ("ray_ferry_stage_latency_ms_count", 1.0),
    "plain": ("ray_ferry_idle_plain", 1.0),
}


@ray.remote(num_cpus=0)
class Recorder:
    def record(self) -> None:
        from ray.util.metrics import Gauge

        from pipeline import metrics

        metrics.set_queue_depth("digits", 3)
        metrics.set_executor({"graph_replays": 0, "eager_runs": 5, "captures": 0})
        metrics.observe_stage("gpu", "digits", 2.0)
        metrics.flush()
        self.plain = Gauge("ferry_idle_plain", "a plain Ray gauge, set once")
        self.plain.set(1.0)


def main() -> None:
    ray.init(
        address="local",
        num_cpus=1,
        include_dashboard=False,
        log_to_driver=False,
        _system_config={"metrics_report_interval_ms": INTERVAL_MS},
    )
    try:
        target = f"127.0.0.1:{ray._private.worker.global_worker.node.metrics_export_port}"
        r = Recorder.remote()
        ray.get(r.record.remote())
        t0, reads = time.time(), []
        while time.time() - t0 < IDLE_S:
            time.sleep(EVERY_S)
            shown = {name: v for name, _lab, v in ray_probe.scrape("ray_ferry_", [target])}
            reads.append(
                {
                    "s": round(time.time() - t0, 1),
                    "shown": {k: shown.get(name) for k, (name, _) in SERIES.items()},
                }
            )
        out = {
            "interval_ms": INTERVAL_MS,
            "idle_s": IDLE_S,
            "every_s": EVERY_S,
            "want": SERIES,
            "reads": reads,
        }
        print(json.dumps(out))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
