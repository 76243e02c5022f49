"""`ferry config check`: Serve's schema and Ferry's pipeline config, in one command."""

from __future__ import annotations

import importlib.util
import os

import pytest
import yaml

from deployments import cli
from deployments.grpc_proxy import SERVICER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    "name", ["serve_config.yaml", "serve_config.gpu.yaml", "serve_config.gpu2.yaml"]
)
def test_shipped_configs_pass_both_checks(name, capsys):
    rc = cli.main(["config", "check", os.path.join(ROOT, name)])
    if name == "serve_config.gpu.yaml" and importlib.util.find_spec("torchvision") is None:
        # its ResNet-50 is torchvision's on the torch engine: without the extra the check
        # loads nothing it cannot and says which extra is missing (CI has torch, no torchvision)
        err = capsys.readouterr().err
        assert rc == 1 and "model 'resnet50'" in err and "ferry[torchvision]" in err, err
        return
    assert rc == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok: ") and "Serve's schema" in out[0]
    assert out[1].startswith("ok: ") and "Ferry's pipeline config" in out[1]


def _write(tmp_path, name, data) -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_a_serve_schema_error_is_reported_as_serves(tmp_path, capsys):
    raw = yaml.safe_load(open(os.path.join(ROOT, "serve_config.yaml")))
    raw["http_options"]["port"] = "eighty"
    rc = cli.main(["config", "check", _write(tmp_path, "s.yaml", raw)])
    err = capsys.readouterr().err
    assert rc == 1 and "Serve's schema" in err and "http_options.port" in err


def test_a_pipeline_error_is_reported_as_ferrys_with_its_field(tmp_path, capsys):
    raw = yaml.safe_load(open(os.path.join(ROOT, "serve_config.yaml")))
    raw["applications"][0]["args"]["config"]["batching"]["max_wait_ms"] = -1
    rc = cli.main(["config", "check", _write(tmp_path, "f.yaml", raw)])
    err = capsys.readouterr().err
    assert rc == 1 and "Ferry's pipeline config" in err and "batching.max_wait_ms" in err


def test_a_bare_pipeline_config_and_a_config_path_relative_to_the_file(tmp_path, capsys):
    pipeline = {"models": [{"name": "digits", "arch": "digits"}], "executor": {"backend": "numpy"}}
    bare = _write(tmp_path, "pipeline.yaml", pipeline)
    assert cli.main(["config", "check", bare]) == 0
    serve_cfg = {
        "applications": [
            {
                "name": "a",
                "import_path": "deployments.app:build_app",
                "args": {"config": "pipeline.yaml"},
            },
            {"name": "b", "import_path": "other.module:app", "route_prefix": "/b"},
        ]
    }
    assert cli.main(["config", "check", _write(tmp_path, "serve.yaml", serve_cfg)]) == 0
    out = capsys.readouterr().out
    assert "application 'a'" in out and "skipped:" in out and "other.module:app" in out


@pytest.mark.parametrize(
    "name, gpus, says",
    [
        ("serve_config.yaml", 1, "backend numpy; no deployment asks for a GPU)"),
        (
            "serve_config.gpu.yaml",
            4,
            "backend cupy; GPUs asked: ingress 32 x 0.125 = 4, replicas_per_gpu on 4 GPU(s))",
        ),
        ("serve_config.gpu2.yaml", 1, "GPUs asked: preprocess 1 x 1, inference 1 x 1 = 2)"),
    ],
)
def test_the_summary_tells_the_backend_and_the_gpus_asked_truthfully(name, gpus, says, capsys):
    """A CPU config is not "placed for 1 GPU(s)"."""
    assert (
        cli.main(["config", "check", os.path.join(ROOT, name), "--gpus", str(gpus), "--no-load"])
        == 0
    )
    line = capsys.readouterr().out.splitlines()[1]
    assert line.endswith(says), line
    assert "placed for" not in line


def test_a_missing_model_file_fails_the_check_without_loading(tmp_path, capsys):
    """The config validates; the check (``pipeline.check``) finds the file is not there."""
    missing = str(tmp_path / "nowhere.onnx")
    bare = _write(
        tmp_path, "p.yaml", {"models": [{"name": "m", "engine": "onnx", "source": missing}]}
    )
    assert cli.main(["config", "check", bare, "--no-load"]) == 1
    err = capsys.readouterr().err
    assert (
        "Ferry's pipeline config" in err and f"model 'm': source file not found: {missing}" in err
    )


def test_the_shipped_configs_serve_grpc_and_the_check_says_where(capsys):
    for name in ("serve_config.yaml", "serve_config.gpu.yaml", "serve_config.gpu2.yaml"):
        assert cli.main(["config", "check", "--no-load", os.path.join(ROOT, name)]) == 0
        last = capsys.readouterr().out.splitlines()[-1]
        assert last.startswith("ok: ") and "gRPC on port 9000" in last, last


@pytest.mark.parametrize(
    "grpc_options, rc, says",
    [
        (None, 0, "HTTP only"),
        ({"port": 9100}, 0, "is not served over gRPC"),
        ({"port": 8000, "grpc_servicer_functions": [SERVICER]}, 1, "is HTTP's port too"),
        (
            {"port": 9100, "grpc_servicer_functions": [SERVICER, "deployments.nope.add_x"]},
            1,
            "deployments.nope.add_x",
        ),
    ],
)
def test_grpc_options_are_checked(tmp_path, capsys, grpc_options, rc, says):
    raw = yaml.safe_load(open(os.path.join(ROOT, "serve_config.yaml")))
    raw.pop("grpc_options")
    if grpc_options is not None:
        raw["grpc_options"] = grpc_options
    got = cli.main(["config", "check", "--no-load", _write(tmp_path, "g.yaml", raw)])
    out = capsys.readouterr()
    assert got == rc and says in out.out + out.err
