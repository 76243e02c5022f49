"""``ferry models``: the repository of a config listed and checked, each entry loaded as
the inference replica loads it."""

from __future__ import annotations

import json

import yaml

from deployments.cli import main


def test_models_lists_checks_and_fails_an_entry_that_does_not_load(tmp_path, capsys):
    labels = tmp_path / "five.txt"
    labels.write_text("a\nb\nc\nd\ne\n")  # digits has 10 classes
    cfg = {
        "models": [
            {"name": "digits", "arch": "digits"},
            {"name": "wrong", "arch": "digits", "labels": str(labels), "max_batch": 4},
        ],
        "executor": {"backend": "numpy", "buckets": [1, 2, 4, 8]},
        "batching": {"max_batch_size": 8, "max_queue": 300},
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
    assert ok["max_batch"] == {"gpu": 8, "buckets": [1, 2, 4, 8], "v2_request_rows": 300}
    assert ok["tensors"]["outputs"][0]["shape"] == [-1, 10]
    assert ok["v2_names"] == ["digits", "digits_encoded"]
    assert wrong["loads"] is False and "labels file does not match" in wrong["error"]
    assert wrong["max_batch"]["gpu"] == 4 and wrong["labels"]["count"] == 5


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
        "batching": {"max_batch_size": 8},
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["models", str(path), "--json", "--no-load"]) == 0
    (rows,) = json.loads(capsys.readouterr().out).values()
    assert [r["v2_names"] for r in rows] == [
        ["digits"],
        ["digits_encoded", "digits_encoded_encoded"],
    ]
