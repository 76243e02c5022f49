"""``pipeline.check.check``: the one step that checks a valid config against its engines, its
files and the cluster, and resolves it for the cluster; ``pipeline.config`` a leaf."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline.check import ConfigCheckFailed, ModelsDoNotLoad, check, entry_problems
from pipeline.config import ModelConfig, PipelineConfig
from pipeline.placement import Cluster, NodeShape

PER_GPU = {
    "placement": "one_process",
    "executor": {"pool_limit_fraction": 0.113},
    "ingress_deployment": {"replicas_per_gpu": 8, "num_cpus": 1},
}


def test_validating_a_config_imports_nothing_of_ferry_but_the_config():
    """The models validate shapes and values: no engine, no placement, no repository."""
    code = (
        "import sys, json\n"
        "from pipeline.config import PipelineConfig\n"
        "PipelineConfig.model_validate({'models': [{'name': 'm', 'engine': 'onnx',"
        " 'source': '/no/such/m.onnx', 'labels': '/no/labels.txt'}],"
        " 'inference_deployment': {'num_gpus': 0.25, 'num_replicas': 4},"
        " 'executor': {'pool_limit_fraction': 0.2}})\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('pipeline'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    loaded = json.loads(out)
    assert "pipeline.config.pipeline" in loaded  # the validators ran in that process
    others = [m for m in loaded if m not in ("pipeline", "pipeline.errors")]
    assert all(m.startswith("pipeline.config") for m in others), others


def test_a_valid_config_whose_files_are_missing_is_refused_naming_each():
    """Validation takes it; the check names every problem of every entry in one error."""
    cfg = PipelineConfig(
        models=[
            ModelConfig(name="a", engine="onnx", source="/no/such/a.onnx"),
            ModelConfig(name="b", engine="tensorrt", source="b"),
            ModelConfig(name="c", source="digits", weights="/no/c.npz"),
        ]
    )
    with pytest.raises(ConfigCheckFailed) as info:
        check(cfg)
    text = str(info.value)
    assert "model 'a': source file not found: /no/such/a.onnx" in text
    assert "model 'b': unknown engine 'tensorrt'" in text
    assert "model 'c': weights file not found: /no/c.npz" in text
    assert "\n" not in text and isinstance(info.value, ValueError)


def test_a_labels_file_that_is_not_text_is_refused(tmp_path):
    bad = tmp_path / "labels.txt"
    bad.write_bytes(b"\xff\xfe\xfa\n")
    (problem,) = entry_problems(ModelConfig(name="d", source="digits", labels=str(bad)))
    assert problem.startswith("model 'd': labels file") and "cannot be read" in problem
    good = tmp_path / "ten.txt"
    good.write_text("".join(f"{i}\n" for i in range(10)))
    assert entry_problems(ModelConfig(name="d", source="digits", labels=str(good))) == []


def test_replicas_per_gpu_resolve_against_the_live_nodes_and_must_fit_them():
    ray_nodes = [
        {"NodeID": "head", "Alive": True, "Resources": {"CPU": 8.0}},
        {"NodeID": "gpu0", "Alive": True, "Resources": {"CPU": 16.0, "GPU": 2.0}},
        {"NodeID": "gone", "Alive": False, "Resources": {"CPU": 16.0, "GPU": 2.0}},
    ]
    cluster = Cluster.from_ray(ray_nodes)
    assert cluster.gpus == 2 and [n.node_id for n in cluster.nodes] == ["head", "gpu0"]
    cfg = check(PipelineConfig.model_validate(PER_GPU), cluster)
    ing = cfg.ingress_deployment
    assert (ing.num_replicas, ing.num_gpus, cfg.gpus) == (16, 0.125, 2)
    # 16 replicas of one CPU on a GPU node of 8 cores: refused before Serve is asked
    small = Cluster.of([NodeShape("head", 8, 0), NodeShape("gpu0", 8, 2)])
    with pytest.raises(ConfigCheckFailed, match="16 CPUs on the GPU nodes, which have 8"):
        check(PipelineConfig.model_validate(PER_GPU), small)


def test_what_the_cluster_cannot_tell_is_a_note_or_a_refusal():
    notes: list[str] = []
    explicit = PipelineConfig.model_validate({**PER_GPU, "gpus": 2})
    head_only = Cluster.of([NodeShape("head", 16, 0)])
    assert check(explicit, head_only, tell=notes.append).ingress_deployment.num_replicas == 16
    (note,) = notes
    assert "no GPU node is up" in note
    # no cluster known: an explicit count resolves, 'auto' cannot
    assert check(explicit, None, tell=notes.append).ingress_deployment.num_replicas == 16
    assert check(explicit, Cluster(gpus=4)).ingress_deployment.num_replicas == 16
    assert len(notes) == 1  # nodes unknown: their fit is not checked, nothing to note
    auto = PipelineConfig.model_validate(PER_GPU)
    with pytest.raises(ConfigCheckFailed, match="'auto' but the cluster reports 0 GPUs"):
        check(auto, None)
    assert check(auto, Cluster(gpus=4)).ingress_deployment.num_replicas == 32
    plain = PipelineConfig()
    assert check(plain, None) is plain  # nothing to resolve: the config as it was


def test_with_load_the_models_load_as_the_replica_loads_them(tmp_path):
    notes: list[str] = []
    cfg = PipelineConfig(models=[ModelConfig(name="digits", source="digits")])
    check(cfg, None, load=True, tell=notes.append)
    (note,) = notes
    assert note.startswith("models load (on numpy") and note.endswith(": digits")
    three = tmp_path / "three.txt"
    three.write_text("a\nb\nc\n")  # a readable file, but 3 labels for 10 classes
    bad = PipelineConfig(models=[ModelConfig(name="d", source="digits", labels=str(three))])
    check(bad, None)  # the files are there: only loading the model can tell
    with pytest.raises(ModelsDoNotLoad, match="model 'd'.*labels file does not match"):
        check(bad, None, load=True)
