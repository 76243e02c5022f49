"""Run as a script (its own Ray cluster): Ferry's split form on a simulated cluster of a CPU head
and a worker with two (fake) GPUs, its replica counts and GPU shares from ``replicas_per_gpu``;
then, under load, that worker lost and a new one joined (``multinode_failover.py``).

Prints one JSON line: the node every replica of each deployment ran on, the answer to one
classify request, the message of a layout the cluster cannot hold, and the failover's record.
``tests/integration/test_placement_cluster.py`` runs it and checks the result.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from tests.integration.multinode_failover import PORT, failover  # noqa: E402

POOL = "ferry.io/pool"
WORKER = {"num_cpus": 3, "num_gpus": 2, "labels": {POOL: "gpu"}}


def config(inference_cpus: float) -> dict:
    return {
        "models": [{"name": "digits", "arch": "digits"}],
        "executor": {"backend": "numpy", "buckets": [1, 2, 4], "pool_limit_fraction": 0.05},
        "batching": {"max_wait_ms": 2},
        "gpus": "auto",
        "ingress_deployment": {"num_cpus": 0.25, "label_selector": {POOL: "cpu"}},
        "preprocess_deployment": {"num_cpus": 0.25, "label_selector": {POOL: "cpu"}},
        "postprocess_deployment": {"num_cpus": 0.25, "label_selector": {POOL: "cpu"}},
        # two replicas on each GPU of the cluster: four on the worker's two GPUs
        "inference_deployment": {"replicas_per_gpu": 2, "num_cpus": inference_cpus},
    }


def replica_nodes() -> dict[str, list[str]]:
    from ray._private import state

    nodes: dict[str, list[str]] = {}
    for a in state.actors().values():
        cls = a.get("ActorClassName") or ""
        if a.get("State") == "ALIVE" and cls.startswith("ServeReplica:ferry:"):
            nodes.setdefault(cls.rsplit(":", 1)[1], []).append(a["Address"]["NodeID"])
    return nodes


def main() -> None:
    from deployments.app import build_app
    from pipeline.imaging import encode_png
    from pipeline.models import digits

    x, y = digits.load_split()[2][0], int(digits.load_split()[3][0])

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "labels": {POOL: "cpu"}})
    worker = cluster.add_node(**WORKER)
    ray.init(address=cluster.address, log_to_driver=False)
    out: dict = {"head": cluster.head_node.node_id, "worker": worker.node_id}
    try:
        # one proxy, on the head: every node of this simulated cluster is 127.0.0.1, and a
        # proxy on the worker would take connections that its removal then cuts (on a real
        # cluster the load balancer stops sending to a lost node's proxy)
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": PORT})
        try:  # 4 inference replicas x 2 CPUs do not fit the worker's 3 CPUs
            build_app({"config": config(inference_cpus=2.0)})
            out["refused"] = None
        except Exception as exc:  # (ValueError, or the builder's one-line refusal)
            out["refused"] = str(exc)
        serve.run(build_app({"config": config(inference_cpus=0.5)}), name="ferry", route_prefix="/")
        out["replicas"] = replica_nodes()
        req = urllib.request.Request(
            f"http://127.0.0.1:{PORT}/v1/models/digits/classify",
            data=encode_png(x),
            headers={"Content-Type": "image/png"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            out["status"] = r.status
            out["answer"] = json.loads(r.read())
        out["expected_label"] = str(y)
        out["failover"] = failover(cluster, worker, encode_png(x), WORKER)
    finally:
        serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
