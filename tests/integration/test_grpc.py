"""KServe v2 / Triton's gRPC service with Triton's own client (tritonclient.grpc) and
perf_analyzer -i grpc, through Serve's real gRPC proxy to a real Ferry app on the CPU backend
-- and the same answers, errors and statistics as the HTTP routes give."""

from __future__ import annotations

import json
import queue
import subprocess

import grpc
import httpx
import numpy as np
import pytest

from tests.integration.helpers import BASE, GRPC_PORT, cpu_config, deploy, undeploy
from tests.integration.test_triton import _perf_analyzer, classify_v1, needs_pa, pictures

pytestmark = pytest.mark.integration
APP = "grpc"
URL = f"127.0.0.1:{GRPC_PORT}"
LIMIT = 1 << 20  # ingress.max_body_bytes: a gRPC message over it is refused


@pytest.fixture(scope="module")
def client(ray_cluster):
    import tritonclient.grpc as tg

    deploy(cpu_config(ingress={"max_body_bytes": LIMIT}), name=APP)
    c = tg.InferenceServerClient(URL)
    yield c
    c.close()
    undeploy(APP)


def digits(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 8, 8, 1), dtype=np.uint8)


def tensor(x: np.ndarray, name: str = "image", datatype: str = "UINT8"):
    import tritonclient.grpc as tg

    i = tg.InferInput(name, list(x.shape), datatype)
    i.set_data_from_numpy(x)  # raw_input_contents
    return i


def http_probs(x: np.ndarray) -> np.ndarray:
    import tritonclient.http as th

    c = th.InferenceServerClient(BASE.removeprefix("http://"))
    i = th.InferInput("image", list(x.shape), "UINT8")
    i.set_data_from_numpy(x, binary_data=True)
    return c.infer("digits", [i]).as_numpy("probabilities")


def refused(call, *args, **kw):
    """The InferenceServerException of a call that must fail; its details are Ferry's JSON."""
    from tritonclient.utils import InferenceServerException

    with pytest.raises(InferenceServerException) as e:
        call(*args, **kw)
    return e.value


def test_health_metadata_config_and_index_are_the_http_answers(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits") and client.is_model_ready("digits_encoded", "1")
    assert not client.is_model_ready("no_such_model")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "ferry" and "statistics" in meta["extensions"]
    for model in ("digits", "resnet50_encoded"):
        over_http = httpx.get(f"{BASE}/v2/models/{model}", timeout=30).json()
        got = client.get_model_metadata(model, as_json=True)
        for t in got["inputs"] + got["outputs"]:  # (protobuf's JSON: int64 as strings)
            t["shape"] = [int(d) for d in t["shape"]]
        assert got == over_http
        config = client.get_model_config(model, "1", as_json=True)["config"]
        http_config = httpx.get(f"{BASE}/v2/models/{model}/config", timeout=30).json()
        assert config["max_batch_size"] == http_config["max_batch_size"]
        assert config["input"] == [
            {**t, "dims": [str(d) for d in t["dims"]]} for t in http_config["input"]
        ]
        assert [o["name"] for o in config["output"]] == [o["name"] for o in http_config["output"]]
        assert config["dynamic_batching"]["preferred_batch_size"] == [1, 2, 4, 8]
    index = client.get_model_repository_index(as_json=True)["models"]
    assert sorted((m["name"], m["state"]) for m in index) == [
        ("digits", "READY"),
        ("digits_encoded", "READY"),
        ("resnet50", "READY"),
        ("resnet50_encoded", "READY"),
    ]


def test_binary_tensors_answer_as_over_http(client):
    import tritonclient.grpc as tg

    x = digits(5, seed=1)
    r = client.infer("digits", [tensor(x)], request_id="r-1", priority=1)
    probs = r.as_numpy("probabilities")
    np.testing.assert_allclose(probs, http_probs(x), rtol=1e-5, atol=1e-6)
    assert r.as_numpy("logits").shape == (5, 10)
    answer = r.get_response(as_json=True)
    assert answer["id"] == "r-1" and answer["model_name"] == "digits"
    params = answer["parameters"]
    assert params["random_weights"]["bool_param"] is False
    assert float(params["timings_ms.total"]["double_param"]) > 0
    # one output asked for, as Triton's classification strings "score:index:label"
    out = [tg.InferRequestedOutput("probabilities", class_count=3)]
    top = client.infer("digits", [tensor(x)], outputs=out)
    assert [o.name for o in top.get_response().outputs] == ["probabilities"]
    for row, p in zip(top.as_numpy("probabilities"), probs, strict=True):
        score, index, label = row[0].decode().split(":")
        assert int(index) == int(np.argmax(p)) == int(label)
        assert abs(float(score) - float(p.max())) < 1e-5
    # tritonclient's other ways to call: async_infer (a callback), and its asyncio client
    done: queue.Queue = queue.Queue()
    client.async_infer("digits", [tensor(x)], lambda result, error: done.put((result, error)))
    result, error = done.get(timeout=120)
    assert error is None
    np.testing.assert_allclose(result.as_numpy("probabilities"), probs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(aio_probs(x), probs, rtol=1e-5, atol=1e-6)
    # numbers for a UINT8 input are taken as pixels, as over HTTP
    f = client.infer("digits", [tensor(x.astype(np.float32), datatype="FP32")])
    np.testing.assert_allclose(f.as_numpy("probabilities"), probs, rtol=1e-5, atol=1e-6)


def aio_probs(x: np.ndarray) -> np.ndarray:
    import asyncio

    import tritonclient.grpc.aio as ta

    async def main():
        async with ta.InferenceServerClient(URL) as c:
            assert await c.is_model_ready("digits")
            return (await c.infer("digits", [tensor(x)])).as_numpy("probabilities")

    return asyncio.run(main())


def stub():
    from tritonclient.grpc import service_pb2_grpc

    return service_pb2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(URL))


def test_typed_contents_answer_as_raw_contents(client):
    """KServe's typed ``contents`` fields (tritonclient always sends raw): uint_contents for
    UINT8 pixels, bytes_contents for image files (no base64: protobuf bytes)."""
    from tritonclient.grpc import service_pb2 as pb

    x = digits(2, seed=2)
    req = pb.ModelInferRequest(model_name="digits")
    t = req.inputs.add(name="image", datatype="UINT8", shape=list(x.shape))
    t.contents.uint_contents.extend(int(v) for v in x.ravel())
    resp = stub().ModelInfer(req, timeout=60)
    names = [o.name for o in resp.outputs]
    got = np.frombuffer(resp.raw_output_contents[names.index("probabilities")], "<f4")
    raw = client.infer("digits", [tensor(x)]).as_numpy("probabilities")
    np.testing.assert_allclose(got.reshape(2, 10), raw, rtol=1e-5, atol=1e-6)
    blobs = pictures(2, 8, 1, seed=3)
    req = pb.ModelInferRequest(model_name="digits_encoded")
    t = req.inputs.add(name="image_bytes", datatype="BYTES", shape=[2, 1])
    t.contents.bytes_contents.extend(blobs)
    resp = stub().ModelInfer(req, timeout=60)
    names = [o.name for o in resp.outputs]
    got = np.frombuffer(resp.raw_output_contents[names.index("probabilities")], "<f4")
    for blob, p in zip(blobs, got.reshape(2, 10), strict=True):
        assert [t["class"] for t in classify_v1("digits", blob, 3)] == list(
            np.argsort(-p, kind="stable")[:3]
        )


def test_bytes_images_are_decoded_as_the_http_path_decodes_them(client):
    for model, size, channels in (("digits", 8, 1), ("resnet50", 64, 3)):
        blobs = pictures(3, size, channels, seed=11)
        x = np.array(blobs, dtype=object).reshape(-1, 1)
        probs = client.infer(f"{model}_encoded", [tensor(x, "image_bytes", "BYTES")])
        probs = probs.as_numpy("probabilities")
        assert probs.shape[0] == 3
        for blob, p in zip(blobs, probs, strict=True):
            top = classify_v1(model, blob, 5)
            assert [t["class"] for t in top] == list(np.argsort(-p, kind="stable")[:5])
            np.testing.assert_allclose([t["score"] for t in top], np.sort(p)[::-1][:5], atol=1e-6)
    bad = np.array([[blobs[0]], [b"GIF89a not a JPEG or PNG"]], dtype=object)
    e = refused(client.infer, "resnet50_encoded", [tensor(bad, "image_bytes", "BYTES")])
    assert e.status() == "StatusCode.INVALID_ARGUMENT"  # (HTTP: 415)
    assert json.loads(e.message())["detail"]["element"] == 1


def test_statistics_are_one_book_for_both_protocols(client):
    before = client.get_inference_statistics("digits", as_json=True)["model_stats"][0]
    client.infer("digits", [tensor(digits(4, seed=9))])
    http_probs(digits(2, seed=9))
    refused(client.infer, "digits", [tensor(digits(1))], timeout=1)  # 1 us: a 504
    after = client.get_inference_statistics("digits", "1", as_json=True)["model_stats"][0]
    s0, s1 = before.get("inference_stats", {}), after["inference_stats"]
    assert int(s1["success"]["count"]) == int(s0.get("success", {}).get("count", 0)) + 2
    assert int(s1["fail"]["count"]) == int(s0.get("fail", {}).get("count", 0)) + 1
    assert int(after["inference_count"]) == int(before.get("inference_count", 0)) + 6
    over_http = httpx.get(f"{BASE}/v2/models/digits/stats", timeout=30).json()["model_stats"][0]
    assert over_http["inference_stats"]["success"]["count"] >= int(s1["success"]["count"])
    every = client.get_inference_statistics(as_json=True)["model_stats"]
    assert {m["name"] for m in every} == {
        "digits",
        "resnet50",
        "digits_encoded",
        "resnet50_encoded",
    }


def test_a_stream_of_100_requests_is_answered_request_for_request(client):
    """ModelStreamInfer, bidirectional through Serve's proxy: 100 requests sent before any
    answer is read, each answered by id; a bad one is answered with its error and the
    stream goes on."""
    import tritonclient.grpc as tg

    answers: queue.Queue = queue.Queue()
    x = digits(100, seed=5)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i in range(100):  # (half of them as a client of decoupled models asks)
            client.async_stream_infer(
                "digits",
                [tensor(x[i : i + 1])],
                request_id=f"s{i}",
                enable_empty_final_response=i % 2 == 1,
            )
        client.async_stream_infer("no_such_model", [tensor(x[:1])], request_id="bad")
    finally:
        client.stop_stream()  # returns once the server has closed the stream: all answered
    got, errors = {}, []
    while not answers.empty():
        result, error = answers.get_nowait()
        if error is not None:
            errors.append(error)
        else:
            answer = result.get_response()
            assert answer.parameters["triton_final_response"].bool_param
            got[answer.id] = result.as_numpy("probabilities")[0]
    assert sorted(got) == sorted(f"s{i}" for i in range(100))
    expected = http_probs(x)
    for i in (0, 42, 99):
        np.testing.assert_allclose(got[f"s{i}"], expected[i], rtol=1e-5, atol=1e-6)
    (error,) = errors
    assert json.loads(error.message())["type"] == "ModelNotFound"
    assert isinstance(error, tg.InferenceServerException)


def test_each_bad_request_gets_its_status_code_and_ferrys_error(client):
    x = digits(1)
    cases = {
        "unknown model": (("no_such_model", [tensor(x)]), {}, "NOT_FOUND", "ModelNotFound"),
        "wrong shape": (("digits", [tensor(np.zeros((1, 8, 9, 1), np.uint8))]), {}, "INVALID_ARGUMENT", "InvalidInput"),
        "wrong dtype": (("digits", [tensor(x.astype(np.int32), datatype="INT32")]), {}, "INVALID_ARGUMENT", "InvalidInput"),
        "unknown version": (("digits", [tensor(x)]), {"model_version": "2"}, "NOT_FOUND", "ModelNotFound"),
        "parameters.timeout passes": (("digits", [tensor(x)]), {"timeout": 1}, "DEADLINE_EXCEEDED", "DeadlineExceeded"),
        "x-deadline-ms passes": (("digits", [tensor(x)]), {"headers": {"x-deadline-ms": "0.001"}}, "DEADLINE_EXCEEDED", "DeadlineExceeded"),
        "over the body limit": (("resnet50", [tensor(np.zeros((8, 224, 224, 3), np.uint8))]), {}, "RESOURCE_EXHAUSTED", "PayloadTooLarge"),
    }  # fmt: skip
    for what, (args, kw, code, kind) in cases.items():
        e = refused(client.infer, *args, **kw)
        assert e.status() == f"StatusCode.{code}", (what, e)
        body = json.loads(e.message())
        assert body["type"] == kind and body["request_id"] and body["error"], (what, body)
    assert "model control mode is NONE" in refused(client.load_model, "digits").message()
    # the call's own gRPC deadline: passed before any answer (the client's or Ferry's)
    e = refused(client.infer, "digits", [tensor(x)], client_timeout=1e-4)
    assert e.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert client.infer("digits", [tensor(x)], client_timeout=120).as_numpy("logits").shape == (
        1,
        10,
    )
    e = refused(client.get_system_shared_memory_status)
    assert e.status() == "StatusCode.UNIMPLEMENTED"


TOKEN = "grpc-s3cret"


def test_the_token_the_calls_deadline_and_a_draining_app_over_grpc(client):
    """On an app of its own: FERRY_AUTH_TOKEN asked as ``authorization: Bearer`` metadata
    (health public, as /v2/health/*); a default deadline of 1 us, so that a request answers
    only where the call's own gRPC deadline reached the ingress through Serve's proxy and
    replaced it; then the app drained: a request shed with 503's UNAVAILABLE and
    ``retry-after`` trailing metadata."""
    from ray import serve

    from deployments import drain
    from deployments.app import build

    name = "grpc-auth"
    cfg = cpu_config(
        models=[{"name": "digits", "arch": "digits"}],
        ingress_deployment={"env_vars": {"FERRY_AUTH_TOKEN": TOKEN}},
        batching={"default_deadline_ms": 0.001},
    )
    serve.run(build(cfg), name=name, route_prefix="/auth")  # (beside the module's app)
    try:
        to = {"application": name}
        auth = {**to, "authorization": f"Bearer {TOKEN}"}
        x = digits(1)
        assert client.is_server_live(headers=to) and client.is_server_ready(headers=to)
        for headers in (to, {**to, "authorization": "Bearer wrong"}):
            e = refused(client.infer, "digits", [tensor(x)], headers=headers)
            assert e.status() == "StatusCode.UNAUTHENTICATED"
            e = refused(client.get_model_metadata, "digits", headers=headers)
            assert e.status() == "StatusCode.UNAUTHENTICATED"
        e = refused(client.infer, "digits", [tensor(x)], headers=auth)  # the default: 1 us
        assert json.loads(e.message())["type"] == "DeadlineExceeded"
        ok = client.infer("digits", [tensor(x)], headers=auth, client_timeout=120)
        assert ok.as_numpy("logits").shape == (1, 10)  # the call's deadline, not the default
        errors: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: errors.put(error), headers=to)
        try:
            client.async_stream_infer("digits", [tensor(x)])
        finally:
            client.stop_stream()
        assert errors.get_nowait().status() == "StatusCode.UNAUTHENTICATED"
        assert drain.drain_app(name, timeout_s=60)
        req = stub_request(x)
        with pytest.raises(grpc.RpcError) as e:
            stub().ModelInfer(req, metadata=tuple(auth.items()), timeout=120)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert json.loads(e.value.details())["detail"]["reason"] == "draining"
        assert ("retry-after", "1") in tuple(e.value.trailing_metadata())
    finally:
        undeploy(name)
        drain.forget(name)


def stub_request(x: np.ndarray):
    from tritonclient.grpc import service_pb2 as pb

    req = pb.ModelInferRequest(model_name="digits")
    req.inputs.add(name="image", datatype="UINT8", shape=list(x.shape))
    req.raw_input_contents.append(x.tobytes())
    return req


@needs_pa
def test_perf_analyzer_over_grpc(client, tmp_path):
    """perf_analyzer -i grpc as a Triton user runs it (not how fast: benchmarks/), then with
    --streaming (ModelStreamInfer); the server's statistics count what it sent."""
    before = client.get_inference_statistics("digits", as_json=True)["model_stats"][0]
    for extra in ([], ["--streaming"]):
        out = tmp_path / f"pa{len(extra)}.csv"
        r = subprocess.run(
            [_perf_analyzer(), "-m", "digits", "-u", URL, "-i", "grpc", *extra]
            # stable within 2x over up to 30 windows of 1 s: the 2-core machine is noisy, and
            # this checks that perf_analyzer runs against Ferry unchanged, not how fast
            + ["--concurrency-range", "4", "-p", "1000", "-s", "100", "--max-trials", "30"]
            + ["-f", str(out)],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        rows = out.read_text().splitlines()
        assert rows[0].startswith("Concurrency") and len(rows) == 2
        assert float(rows[1].split(",")[1]) > 0  # inferences/s
    after = client.get_inference_statistics("digits", as_json=True)["model_stats"][0]
    assert int(after["inference_stats"]["success"]["count"]) > int(
        before.get("inference_stats", {}).get("success", {}).get("count", 0)
    )
