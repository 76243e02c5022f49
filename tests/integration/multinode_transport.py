"""Run as a script (its own Ray cluster): a producer and a consumer actor on different nodes
of a ``ray.cluster_utils.Cluster`` exchange tensors over the object-store channel.

Prints one JSON line: what the consumer received, in order, with checksums, and where each
actor ran. ``tests/integration/test_transport.py`` runs it and checks the result.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

CASES = [
    ((1,), "float32"),
    ((7, 5), "float16"),
    ((3, 224, 224, 3), "uint8"),
    ((1000,), "int64"),
    ((2, 3, 4), "float64"),
    ((513, 129), "int32"),
    ((0,), "float32"),
    ((8, 8), "bool"),
]


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]


@ray.remote(resources={"consumer_node": 1}, num_cpus=0)
class Consumer:
    def __init__(self) -> None:
        from pipeline.transport.object_store import ObjectStoreReceiver

        self.rx = ObjectStoreReceiver("p->c")
        self.got: list[dict] = []

    def take(self, env) -> int:
        arr, meta = self.rx.recv(env, timeout=30)
        self.got.append(
            {
                "seq": env.seq,
                "i": meta["i"],
                "shape": list(arr.shape),
                "dtype": arr.dtype.name,
                "digest": digest(arr),
            }
        )
        return env.seq

    def received(self) -> list[dict]:
        return self.got

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


@ray.remote(resources={"producer_node": 1}, num_cpus=0)
class Producer:
    def __init__(self, consumer) -> None:
        from pipeline.transport.object_store import ObjectStoreSender

        self.tx = ObjectStoreSender("p->c")
        self.consumer = consumer

    def run(self, rounds: int) -> list[dict]:
        rng = np.random.default_rng(0)
        sent = []
        pending = []
        i = 0
        for _ in range(rounds):
            for shape, dtype in CASES:
                a = (
                    (rng.standard_normal(shape) * 100).astype(dtype)
                    if dtype != "bool"
                    else rng.random(shape) > 0.5
                )
                env = self.tx.send(a, {"i": i})
                pending.append(
                    self.consumer.take.remote(env)
                )  # calls from one caller arrive in order
                sent.append(
                    {
                        "seq": env.seq,
                        "i": i,
                        "shape": list(a.shape),
                        "dtype": a.dtype.name,
                        "digest": digest(a),
                    }
                )
                i += 1
        ray.get(pending)
        return sent

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1, resources={"producer_node": 1})
    cluster.add_node(num_cpus=1, resources={"consumer_node": 1})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        consumer = Consumer.remote()
        producer = Producer.remote(consumer)
        sent = ray.get(producer.run.remote(3))
        got = ray.get(consumer.received.remote())
        nodes = ray.get([producer.node.remote(), consumer.node.remote()])
        print(
            json.dumps(
                {"sent": sent, "got": got, "nodes": nodes, "cluster_nodes": len(ray.nodes())}
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
