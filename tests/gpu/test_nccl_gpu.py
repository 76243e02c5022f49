"""The NCCL channel between two Ray actors on two GPUs (needs two CUDA devices).

Bit-exact payloads of every dtype from 1 element to 512 MB, in order, over NVLink and over
NCCL's socket transport; a receiver killed mid-stream gives the sender a TransportError
within the timeout and a new link works afterwards; GPU preprocessing on one GPU feeds
inference on the other and classifies as the CPU path does.
"""

from __future__ import annotations

import glob
import time

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

MB = 1 << 20
CASES = [
    (11, (1,), "float32"),
    (12, (7, 5), "float16"),
    (13, (3, 224, 224, 3), "uint8"),
    (14, (1000,), "int64"),
    (15, (2, 3, 4), "float64"),
    (16, (513, 129), "int32"),
    (17, (0,), "float32"),
    (18, (8, 8), "bool"),
    (19, (33,), "int8"),
    (20, (32 * MB,), "float16"),  # 64 MB
    (21, (512 * MB,), "uint8"),  # 512 MB
]
SOCKET_ENV = {
    "NCCL_P2P_DISABLE": "1",
    "NCCL_SHM_DISABLE": "1",
    "NCCL_IB_DISABLE": "1",
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
}


def _two_gpus() -> bool:
    try:
        import cupy

        from pipeline.transport.base import nccl_available

        return cupy.cuda.runtime.getDeviceCount() >= 2 and nccl_available()
    except Exception:
        return False


@pytest.fixture(scope="module")
def ray2():
    if not _two_gpus():
        pytest.skip("needs two CUDA devices and NCCL")
    import ray

    ray.init(num_gpus=2, num_cpus=12, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def peers(ray2):
    """Makes TensorPeer actors (one GPU each) and kills them after the test, pass or fail."""
    from benchmarks.transport_peers import peer_actor

    made = []

    def make(env=None, timeout_s=20.0):
        made.append(peer_actor(env, timeout_s))
        return made[-1]

    yield make
    for a in made:
        ray2.kill(a)
    time.sleep(0.5)  # the GPUs go back to Ray


def GET(refs, timeout: float = 90.0):
    """ray.get with a deadline: a hang fails its test instead of the whole session."""
    import ray

    return ray.get(refs, timeout=timeout)


def _exchange(ray, a, b, rounds: int = 2) -> None:
    """Send every case ``rounds`` times from a to b; b takes them concurrently."""
    b_id = GET(b.endpoint_id.remote())
    for r in range(rounds):
        envs = GET(a.send.remote(b_id, [(s + 100 * r, sh, dt) for s, sh, dt in CASES]))
        takes = [b.take.remote(e) for e in reversed(envs)]  # arrive out of order on purpose
        got = GET(takes, 120)
        assert all(g["ok"] for g in got), [g for g in got if not g["ok"]]
        assert sorted(g["seq"] for g in got) == [e.seq for e in envs]
        assert {g["seed"] for g in got} == {s + 100 * r for s, _, _ in CASES}
        assert GET(a.wait.remote(b_id, envs)) == ["ok"] * len(envs)
    stats = GET(a.stats.remote())
    assert list(stats["out"].values()) == [(0, True, 0)]  # one link, never rebuilt, drained


def test_every_dtype_and_size_arrives_bit_exact_in_order_over_nvlink(ray2, peers):
    a, b = peers(), peers()
    ga, gb = GET([a.gpu.remote(), b.gpu.remote()])
    assert (ga["uuid"], ga["visible"]) != (gb["uuid"], gb["visible"])  # two different GPUs
    _exchange(ray2, a, b)
    # in order: every receive got its own payload (sizes and bytes differ per sequence
    # number), so the receives were matched with the sends in sequence order
    received = GET(b.received.remote())
    assert len(received) == 2 * len(CASES) and all(g["ok"] for g in received)


def test_the_same_over_nccls_socket_transport(ray2, peers, tmp_path):
    env = {**SOCKET_ENV, "NCCL_DEBUG_FILE": str(tmp_path / "nccl.%h.%p.log")}
    a, b = peers(env), peers(env)
    _exchange(ray2, a, b, rounds=1)
    logs = "".join(open(p).read() for p in glob.glob(str(tmp_path / "nccl.*.log")))
    assert "NET/Socket" in logs, logs[-2000:]
    assert "via P2P" not in logs and "via SHM" not in logs


def test_killed_receiver_gives_sender_transport_error_in_time_then_new_link_works(ray2, peers):
    timeout = 5.0
    a, b = peers(timeout_s=timeout), peers(timeout_s=timeout)
    b_id = GET(b.endpoint_id.remote())
    envs = GET(a.send.remote(b_id, CASES[:3]))
    assert all(g["ok"] for g in GET([b.take.remote(e) for e in envs]))

    run = a.stream_to.remote(b_id, b, 100_000, 256 * MB)  # until something breaks
    time.sleep(2.0)
    ray2.kill(b)
    t_kill = time.monotonic()
    res = GET(run, 60)
    waited = time.monotonic() - t_kill
    assert res["error"] == "TransportError", res
    assert res["sent"] > 0, res
    assert res["after_last_ok_s"] <= timeout + 2.0, res
    assert waited <= timeout + 5.0, (waited, res)

    time.sleep(0.5)
    c = peers(timeout_s=timeout)  # a new receiver on the freed GPU; a reuses its process
    c_id = GET(c.endpoint_id.remote())
    envs = GET(a.send.remote(c_id, CASES))
    got = GET([c.take.remote(e) for e in envs], 120)
    assert all(g["ok"] for g in got)
    assert GET(a.wait.remote(c_id, envs)) == ["ok"] * len(envs)
    out = GET(a.stats.remote())["out"]
    assert out[b_id][1] is False and out[c_id][1] is True  # the dead link aborted, new one up


def test_a_lost_envelope_times_out_then_the_link_is_rebuilt(ray2, peers):
    """Envelope 2 never reaches the receiver. Envelope 3 waits for it and fails at the
    deadline, aborting the receiver's end; the sender's next large send cannot complete and
    fails at its deadline, aborting its end; the send after that opens generation 1."""
    timeout = 3.0
    a, b = peers(timeout_s=timeout), peers(timeout_s=timeout)
    b_id = GET(b.endpoint_id.remote())
    first = GET(a.send.remote(b_id, CASES[:2]))
    assert all(g["ok"] for g in GET([b.take.remote(e) for e in first]))
    GET(a.send.remote(b_id, [CASES[2]]))  # lost: never given to b
    nxt = GET(a.send.remote(b_id, [CASES[3]]))
    t0 = time.monotonic()
    with pytest.raises(Exception, match="TransportError"):
        GET(b.take.remote(nxt[0]))
    assert time.monotonic() - t0 < timeout + 3.0
    big = GET(a.send.remote(b_id, [CASES[10]]))  # 512 MB: cannot complete without a receiver
    t0 = time.monotonic()
    status = GET(a.wait.remote(b_id, big))
    assert status[0].startswith("TransportError"), status
    assert time.monotonic() - t0 < timeout + 3.0
    again = GET(a.send.remote(b_id, CASES[:4]))
    assert again[0].token.generation == 1
    got = GET([b.take.remote(e) for e in again], 60)
    assert all(g["ok"] for g in got)
    with pytest.raises(Exception, match="stale envelope"):  # generation 0, late
        GET(b.take.remote(nxt[0]))


def test_gpu_preprocessing_on_one_gpu_feeds_inference_on_the_other(ray2):
    """The Serve app with PreprocessGPU (GPU 0 or 1) and Inference on the other GPU, over
    HTTP, against the CPU decode + CPU executor path on the same PNGs."""
    from ray import serve

    from deployments.app import build
    from pipeline.config import ExecutorConfig, PipelineConfig
    from pipeline.executor import GpuExecutor
    from pipeline.imaging import decode, encode_png
    from pipeline.models import digits
    from pipeline.models.registry import model_info
    from tests.integration.helpers import classify_many

    _, _, xte, yte = digits.load_split()
    n = 300
    big = np.repeat(np.repeat(xte[:n], 2, axis=1), 2, axis=2)  # 56x56: both paths resize
    pngs = [encode_png(x) for x in big]

    cpu = GpuExecutor(ExecutorConfig(backend="numpy", buckets=(1, 8, 64)))
    cpu.load_model("digits", "digits")
    target = model_info("digits").target()
    cpu_pred = []
    for i in range(0, n, 64):
        rows = [decode(p, "image/png", target, 1 << 24) for p in pngs[i : i + 64]]
        cpu_pred += list(np.argmax(cpu.infer("digits", np.stack(rows)), axis=1))
    cpu.close()

    config = PipelineConfig.model_validate(
        {
            "models": [{"name": "digits", "arch": "digits"}],
            "executor": {"backend": "cupy", "buckets": [1, 8, 32, 64], "pool_limit_fraction": 0.1},
            "batching": {"max_wait_ms": 5},
            "placement": "gpu_preprocess",
            "preprocess": {"threads": 4},
            "transport": {"timeout_s": 20},
            "ingress_deployment": {"num_cpus": 1},
            "preprocess_deployment": {"num_cpus": 1, "num_gpus": 1},
            "inference_deployment": {"num_cpus": 1, "num_gpus": 1},
        }
    )
    serve.start(http_options={"host": "127.0.0.1", "port": 8131})
    serve.run(build(config), name="gpupre", route_prefix="/")
    try:
        rs = classify_many(
            "http://127.0.0.1:8131", [(p, "image/png") for p in pngs], "digits", "?top_k=1"
        )
        assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
        gpu_pred = np.array([int(r.json()["top_k"][0]["label"]) for r in rs])
        rv = ray2.get_actor("ferry_nccl_rendezvous", namespace="ferry")  # NCCL was used
        assert GET(rv.pending.remote()) == 0
    finally:
        serve.delete("gpupre")
        serve.shutdown()
    agree = float(np.mean(gpu_pred == np.array(cpu_pred)))
    acc = float(np.mean(gpu_pred == yte[:n]))
    cpu_acc = float(np.mean(np.array(cpu_pred) == yte[:n]))
    print(
        f"GPU preprocessing: agreement with the CPU path {agree:.3f}, "
        f"accuracy {acc:.3f} (CPU path {cpu_acc:.3f}) on 2x-upscaled digits"
    )
    assert agree >= 0.98, agree
    assert acc >= cpu_acc - 0.01 and acc >= 0.9, (acc, cpu_acc)
