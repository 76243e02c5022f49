"""A model that cannot load (issue 31, item 1), without Ray: the one load check
(``pipeline.models.loading``) in the inference stage and in ``ferry config check``; a
refused model beside good ones is answered 503 without Retry-After; none left (or a
required one refused) is the replica's one-line ``ModelsRefused``; a config error is
Serve's one-line ``ConfigRefused``."""

from __future__ import annotations

import asyncio
import pickle

import pytest
import yaml

onnx = pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def topk(tmp_path_factory) -> str:
    from tests.onnx_models import topk_image_net

    path = str(tmp_path_factory.mktemp("topk") / "topk.onnx")
    onnx.save(topk_image_net(), path)
    return path


def config(models: list[dict], **more):
    from pipeline.config import PipelineConfig

    return PipelineConfig.model_validate(
        {
            "placement": "split",
            "models": models,
            "executor": {"backend": "numpy", "buckets": [1, 2]},
            **more,
        }
    )


def good_and_bad(topk: str, required: bool = False) -> list[dict]:
    return [
        {"name": "digits", "arch": "digits"},
        {"name": "my_model", "engine": "onnx", "source": topk, "required": required},
    ]


def names_node_and_op(text: str) -> bool:
    return "my_model" in text and "TopK" in text and "node=" in text and "op='TopK'" in text


def test_the_stage_serves_the_models_that_load_and_refuses_the_other_with_its_reason(topk):
    from pipeline.models.loading import ModelUnavailable
    from pipeline.stages.build import build_inference

    steps = []
    stage = build_inference(  # as the split form builds it: decoding and answering here
        config(good_and_bad(topk)),
        decode_here=True,
        answer_here=True,
        progress=lambda r: steps.append(r.as_dict()),
    )
    assert sorted(stage.signatures()) == ["digits"]
    reason = stage.status()["refused"]["my_model"]
    assert "TopK" in reason and "\n" not in reason
    assert [s["phase"] for s in steps] == ["loading", "loading", "warming", "warming", "ready"]
    assert steps[-1]["loaded"] == ["digits"] and "my_model" in steps[-1]["refused"]
    with pytest.raises(ModelUnavailable) as info:
        asyncio.run(stage.encoded("my_model", [], [], []))
    err = info.value
    assert err.http_status == 503 and err.retryable is False and names_node_and_op(str(err))
    assert pickle.loads(pickle.dumps(err)) == err  # it crosses Serve's hops whole


@pytest.mark.parametrize("required", [False, True])
def test_a_replica_that_cannot_serve_fails_its_start_with_one_line(topk, required):
    from pipeline.models.loading import ModelsRefused
    from pipeline.stages.build import build_inference

    models = good_and_bad(topk, required) if required else good_and_bad(topk)[1:]
    with pytest.raises(ModelsRefused) as info:
        build_inference(config(models))
    line = str(info.value)
    assert "\n" not in line and names_node_and_op(line), line
    assert line.startswith("required model(s) refused" if required else "no model of the config")


def test_a_refused_model_gives_back_what_it_held():
    from pipeline.executor import GpuExecutor
    from pipeline.models.loading import load_models

    cfg = config(
        [{"name": "digits", "arch": "digits"}], executor={"backend": "numpy", "buckets": [1, 2]}
    )
    ex = GpuExecutor(cfg.executor)

    def broken(name, bucket, feed="image"):
        raise RuntimeError("a plan that fails")

    ex.plan = broken  # fails planning its buckets, after the engine was put on the executor
    report = load_models(ex, cfg)
    assert report.refused == {"digits": "RuntimeError: a plan that fails"}
    assert ex.models == {} and report.phase == "failed"
    ex.close()


def _serve_config(tmp_path, models: list[dict]) -> str:
    raw = {
        "applications": [
            {
                "name": "ferry",
                "import_path": "deployments.app:build_app",
                "args": {"config": config(models).model_dump(mode="json")},
            }
        ]
    }
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_config_check_loads_the_models_and_names_model_node_and_op(topk, tmp_path, capsys):
    from deployments import cli

    path = _serve_config(tmp_path, good_and_bad(topk))
    assert cli.main(["config", "check", path]) == 1
    err = capsys.readouterr().err
    assert "models that do not load (on numpy" in err and names_node_and_op(err), err
    assert cli.main(["config", "check", path, "--no-load"]) == 0  # the config itself is fine
    good = _serve_config(tmp_path, good_and_bad(topk)[:1])
    assert cli.main(["config", "check", good]) == 0
    assert "models load (on numpy" in capsys.readouterr().out


def test_a_refused_models_503_has_no_retry_hint():
    from deployments.http_errors import error_response
    from pipeline.errors import QueueFull
    from pipeline.models.loading import ModelUnavailable

    r = error_response(ModelUnavailable(model="m", reason="ModelRefused: no"), "rid")
    assert r.status_code == 503 and "retry-after" not in r.headers
    assert b"retry" not in r.body and b'"reason":"ModelRefused: no"' in r.body
    assert error_response(QueueFull("full"), "rid").headers["retry-after"] == "1"


def test_a_config_that_cannot_be_deployed_fails_the_build_in_one_line(tmp_path):
    from ray.serve.exceptions import RayServeException

    from deployments.app import ConfigRefused, build_app

    missing = str(tmp_path / "nowhere.onnx")
    args = {"config": {"models": [{"name": "my_model", "engine": "onnx", "source": missing}]}}
    with pytest.raises(ConfigRefused) as info:
        build_app(args)
    text = str(info.value)
    assert isinstance(info.value, RayServeException)  # Serve shows its text alone
    assert "\n" not in text and "source file not found" in text and missing in text, text
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_the_repository_index_marks_refused_models_unavailable():
    from pipeline.protocol.triton import repository_index

    rows = repository_index(["a", "b"], {"b": "ModelRefused: no"})
    assert rows[0] == {"name": "a", "version": "1", "state": "READY"}
    assert rows[1] == {
        "name": "b",
        "version": "1",
        "state": "UNAVAILABLE",
        "reason": "ModelRefused: no",
    }


def test_the_number_of_tries_passes_through_to_serve():
    from deployments.app import build
    from pipeline.config import DeploymentOptions

    assert "max_constructor_retry_count" not in DeploymentOptions().serve_options()  # Serve's 20
    once = {"max_constructor_retry_count": 1, "num_cpus": 1.0, "max_ongoing_requests": 128}
    assert DeploymentOptions(**once).serve_options()["max_constructor_retry_count"] == 1
    build(config([{"name": "digits", "arch": "digits"}], inference_deployment=once))
