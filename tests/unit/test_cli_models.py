"""``ferry models``: the repository of a config listed and checked, each entry loaded as
the inference replica loads it."""

from __future__ import annotations

import json

import pytest
import yaml

from deployments.cli import main
from pipeline.check import ConfigCheckFailed, check
from pipeline.config import PipelineConfig


def test_models_lists_checks_and_fails_an_entry_that_does_not_load(tmp_path, capsys):
    labels = tmp_path / "five.txt"
    labels.write_text("a\nb\nc\nd\ne\n")  # digits has 10 classes
    cfg = {
        "models": [
            {"name": "digits", "arch": "digits"},
            {"name": "wrong", "arch": "digits", "labels": str(labels), "max_batch": 4},
        ],
        "executor": {"backend": "numpy", "buckets": [1, 2, 4, 8]},
        "batching": {"max_queue": 300},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["models", str(path), "--json"]) == 1
    (rows,) = json.loads(capsys.readouterr().out).values()
    ok, wrong = rows
    assert ok["loads"] is True and ok["engine"] == "native" and ok["source"] == "digits"
    assert ok["input"] == {
        "height": 8,
        "width": 8,
        "channels": 1,
        "layout": "nhwc",
        "resize": "stretch",
        "dtype": "uint8",
    }
    assert ok["labels"] == {"count": 10, "from": "built-in"}
    assert ok["task"] == "classify"  # told by its [N, 10] output when it loads
    assert ok["max_batch"] == {
        "batch": 8,
        "backend": "numpy",
        "buckets": [1, 2, 4, 8],
        "v2_request_rows": 300,
    }
    assert ok["tensors"]["outputs"][0]["shape"] == [-1, 10]
    assert ok["v2_names"] == ["digits", "digits_encoded"]
    assert wrong["loads"] is False and "labels file does not match" in wrong["error"]
    assert wrong["max_batch"]["batch"] == 4 and wrong["labels"]["count"] == 5


def test_models_reads_a_serve_config_and_lists_without_loading(capsys):
    assert main(["models", "serve_config.yaml", "--no-load"]) == 0
    out = capsys.readouterr().out
    assert "application 'ferry'" in out and "not loaded" in out
    assert "resnet50: " in out and "v2: resnet50, resnet50_encoded" in out
    assert main(["models", "no/such/file.yaml"]) == 1


def test_models_names_no_encoded_view_that_another_entry_already_is(tmp_path, capsys):
    cfg = {  # "digits_encoded" is a model of its own: digits gets no encoded view
        "models": [
            {"name": "digits", "arch": "digits"},
            {"name": "digits_encoded", "arch": "digits"},
        ],
        "executor": {"backend": "numpy", "buckets": [1, 2, 4, 8]},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["models", str(path), "--json", "--no-load"]) == 0
    (rows,) = json.loads(capsys.readouterr().out).values()
    assert [r["v2_names"] for r in rows] == [
        ["digits"],
        ["digits_encoded", "digits_encoded_encoded"],
    ]


def test_models_names_the_backend_a_batch_runs_on_not_always_the_gpu(capsys, monkeypatch):
    monkeypatch.delenv("FERRY_BACKEND", raising=False)
    assert main(["models", "serve_config.yaml", "--no-load"]) == 0  # backend: numpy
    out = capsys.readouterr().out
    assert "  max batch: 8 on numpy (CPU), buckets [1, 2, 4, 8]; 512 rows a v2 request\n" in out
    assert "GPU" not in out
    assert main(["models", "serve_config.gpu.yaml", "--no-load"]) == 0  # backend: cupy
    assert "max batch: 256 on cupy (GPU), buckets [" in capsys.readouterr().out


def test_models_ops_prints_every_supported_onnx_op(capsys):
    from pipeline.importers.onnx_graph import FOLDED_OPS, supported_ops

    assert main(["models", "--ops"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"ONNX ops the onnx engine runs ({len(supported_ops())}; opsets 11-23):"
    assert [x.strip() for x in lines[1:-1]] == list(supported_ops())
    assert lines[-1] == "folded away when the file loads: " + ", ".join(FOLDED_OPS)
    assert main(["models", "--ops", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["ops"] == list(supported_ops()) and got["opsets"] == [11, 23]
    assert "TopK" not in got["ops"] and {"Conv", "Softmax", "Unsqueeze"} <= set(got["ops"])


def test_models_shows_an_onnx_refusal_whole_naming_an_unnamed_node_by_its_output(tmp_path, capsys):
    pytest.importorskip("onnx")
    import onnx

    from pipeline.importers.onnx_graph import supported_ops
    from tests.onnx_models import topk_unnamed

    src = tmp_path / "topk.onnx"
    onnx.save(topk_unnamed(), str(src))
    cfg = {
        "models": [{"name": "t", "engine": "onnx", "source": str(src)}],
        "executor": {"backend": "numpy", "buckets": [1, 2]},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["models", str(path)]) == 1
    (err,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  error: ")]
    n = len(supported_ops())
    assert err == (
        "  error: ModelRefused: this op is not supported; `ferry models --ops` lists the ops "
        f"that are (node=\"node producing 'scores'\", op='TopK', "
        f"supported='{n} ops, listed by `ferry models --ops`')"
    )


def test_models_verdict_is_the_shared_checks_a_missing_file_named_as_config_check_names_it(
    tmp_path, capsys
):
    cfg = {
        "models": [
            {"name": "digits", "arch": "digits"},
            {"name": "gone", "engine": "onnx", "source": str(tmp_path / "gone.onnx")},
        ],
        "executor": {"backend": "numpy", "buckets": [1, 2]},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["models", str(path), "--json"]) == 1
    (rows,) = json.loads(capsys.readouterr().out).values()
    assert [r["loads"] for r in rows] == [True, False]
    with pytest.raises(ConfigCheckFailed) as refused:  # ferry config check's words, exactly
        check(PipelineConfig.model_validate(cfg))
    assert rows[1]["error"] == str(refused.value)
    assert rows[1]["error"] == f"model 'gone': source file not found: {tmp_path / 'gone.onnx'}"


def test_models_says_how_a_torch_model_is_compiled(tmp_path, capsys):
    pytest.importorskip("torch")
    torch_entry = {"name": "t", "engine": "torch", "source": "tests.models.small_torch:small_net"}
    cfg = {
        "models": [
            {"name": "digits", "arch": "digits"},
            {**torch_entry, "input": {"height": 16, "width": 16}, "compile": "dynamic"},
        ],
        "executor": {"backend": "numpy", "buckets": [1, 2, 4]},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["models", str(path), "--json"]) == 0
    (rows,) = json.loads(capsys.readouterr().out).values()
    assert [r["compile"] for r in rows] == [None, "dynamic"]
    assert main(["models", str(path)]) == 0
    out = capsys.readouterr().out
    assert "engine torch (on a GPU: one compile for every bucket)" in out
    assert "engine native, source digits" in out
