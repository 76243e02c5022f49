"""A node lost and regained, for ``multinode_placement.py``: with Ferry's split form up on a
simulated cluster, clients post digits while the worker holding every inference replica is
removed (its raylet and processes end) and, ``OUTAGE_S`` later, a new worker joins.

The record: every request's (phase, start, seconds, status, Retry-After, error type), when
readiness first said not ready and ready again, when Serve had every replica up again, and
the books of the inference replica that took over, when it was ready and after its share of
the load.
``tests/integration/test_placement_cluster.py`` checks it.
"""

from __future__ import annotations

import threading
import time

import httpx
from ray import serve
from ray.cluster_utils import Cluster

PORT = 8125
BASE = f"http://127.0.0.1:{PORT}"
DEADLINE_MS = 3000  # each request's own deadline (X-Deadline-Ms)
CLIENTS = 3
OUTAGE_S = 8.0  # how long no worker node is there
SETTLE_S = 3.0  # load before the loss
AFTER_S = 8.0  # load after every replica is back


class Load:
    """CLIENTS closed-loop clients posting one digit each; every answer kept with its phase."""

    def __init__(self, body: bytes) -> None:
        self.body, self.phase, self.rows = body, "before", []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(CLIENTS)]

    def _client(self) -> None:
        headers = {"content-type": "image/png", "x-deadline-ms": str(DEADLINE_MS)}
        with httpx.Client(base_url=BASE, timeout=60) as c:  # 60 s: a hang, not an answer
            while not self.stop.is_set():
                phase, t0 = self.phase, time.time()
                try:
                    r = c.post("/v1/models/digits/classify", content=self.body, headers=headers)
                    status, retry, kind = r.status_code, r.headers.get("retry-after"), None
                    if status != 200:  # Ferry's JSON error (or not JSON at all: an error)
                        kind = f"{r.json().get('type')}: {r.json().get('error')}"
                except httpx.TimeoutException:
                    status, retry, kind = "hang", None, None
                except Exception as exc:  # noqa: BLE001 - a broken answer is a result too
                    status, retry, kind = "broken", None, type(exc).__name__
                self.rows.append([phase, t0, time.time() - t0, status, retry, kind])
                if status != 200:
                    time.sleep(0.2)  # as a client told Retry-After would, but briefer

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(90)


def ready() -> bool:
    try:
        return httpx.get(BASE + "/v2/health/ready", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(want: bool, timeout: float) -> float | None:
    """Poll readiness until it says ``want``; when it did (epoch s), or None."""
    end = time.time() + timeout
    while time.time() < end:
        if ready() == want:
            return time.time()
        time.sleep(0.25)
    return None


def running() -> dict[str, int]:
    """Each deployment of the app: how many of its replicas Serve has RUNNING ({} while
    its controller does not answer)."""
    try:
        app = serve.status().applications.get("ferry")
    except Exception:  # noqa: BLE001 - the controller busy on a starved box: ask again
        return {}
    if app is None:
        return {}
    return {name: d.replica_states.get("RUNNING", 0) for name, d in app.deployments.items()}


def wait_running(want: dict[str, int], timeout: float) -> float | None:
    """Poll Serve until every deployment has ``want``'s replicas RUNNING; when it did
    (epoch s), or None."""
    end = time.time() + timeout
    while time.time() < end:
        now = running()
        if now and all(now.get(k, 0) >= n for k, n in want.items()):
            return time.time()
        time.sleep(0.5)
    return None


def books(calls: int = 8) -> list[dict]:
    """The executor books (pool bytes and reservations, the GPU queue) of the inference
    replicas that answer ``calls`` status calls (Serve picks the replica of each)."""
    h = serve.get_deployment_handle("Inference", app_name="ferry")
    got = [h.status.remote().result(timeout_s=30) for _ in range(calls)]
    return [{"pool": s["pool"], "queue_depth": s["queue_depth"]} for s in got]


def failover(cluster: Cluster, worker: object, body: bytes, worker_args: dict) -> dict:
    """With the app deployed and ready: load, the worker removed, a new one added; the
    record (epoch seconds; ``rows`` each request's phase, start, seconds, status, Retry-After
    and error type)."""
    out: dict = {"deadline_ms": DEADLINE_MS, "replicas": running()}
    with Load(body) as load:
        time.sleep(SETTLE_S)
        load.phase = "outage"
        out["removed_at"] = time.time()
        cluster.remove_node(worker)  # the raylet and every process of that node end
        out["not_ready_at"] = wait_for(False, 60)
        time.sleep(max(0.0, out["removed_at"] + OUTAGE_S - time.time()))
        load.phase = "rejoin"
        out["added_at"] = time.time()
        cluster.add_node(**worker_args)
        out["ready_again_at"] = wait_for(True, 180)
        out["books_at_ready"] = books() if out["ready_again_at"] else None
        # readiness comes back with the first inference replica; the others are still
        # starting then, which on two cores (beside the other tests) slowed requests to 2 s
        # and had one shed by the queue budget -- so "after" starts once Serve has them all
        out["running_again_at"] = wait_running(out["replicas"], 180)
        load.phase = "after"
        time.sleep(AFTER_S)
    out["books_after_load"] = books() if out["ready_again_at"] else None
    out["rows"] = load.rows
    return out
