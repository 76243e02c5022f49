"""GPU counts into replica counts and shares; layouts refused where the cluster can't hold them."""

from __future__ import annotations

import os

import pytest
import yaml
from pydantic import ValidationError

from pipeline import placement
from pipeline.config import DeploymentOptions, PipelineConfig
from pipeline.placement import NodeShape

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ONE_PROCESS = {
    "placement": "one_process",
    "executor": {"pool_limit_fraction": 0.113},
    "ingress_deployment": {"replicas_per_gpu": 8, "num_cpus": 1},
}


def _shipped_gpu_config() -> dict:
    with open(os.path.join(ROOT, "serve_config.gpu.yaml")) as f:
        return yaml.safe_load(f)["applications"][0]["args"]["config"]


def h200_node(i: int, gpus: int = 1) -> NodeShape:
    return NodeShape(f"gpu{i}", cpus=16.0 * gpus, gpus=float(gpus))


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_the_shipped_gpu_config_scales_with_the_gpu_count(gpus):
    cfg = placement.resolve(PipelineConfig.model_validate(_shipped_gpu_config()), gpus)
    ing = cfg.ingress_deployment
    assert (ing.num_replicas, ing.num_gpus, ing.replicas_per_gpu) == (8 * gpus, 0.125, None)
    assert cfg.gpus == gpus
    opts = ing.serve_options()
    assert opts["num_replicas"] == 8 * gpus and opts["ray_actor_options"]["num_gpus"] == 0.125
    # one node of that many H200s (16 cores each) holds it
    assert placement.check_fits(cfg, [NodeShape("head", 16, 0), h200_node(0, gpus)]) == []


def test_an_explicit_gpu_count_wins_over_the_cluster():
    cfg = PipelineConfig.model_validate({**ONE_PROCESS, "gpus": 2})
    assert placement.resolve(cfg, 8).ingress_deployment.num_replicas == 16


def test_auto_without_gpus_is_refused_with_the_reason():
    cfg = PipelineConfig.model_validate(ONE_PROCESS)
    with pytest.raises(ValueError, match="'auto' but the cluster reports 0 GPUs"):
        placement.resolve(cfg, 0)
    with pytest.raises(ValueError, match="resolved against a GPU count first"):
        cfg.ingress_deployment.serve_options()


def test_a_config_without_replicas_per_gpu_is_left_as_it_is():
    cfg = PipelineConfig.model_validate({})
    assert placement.resolve(cfg, None) is cfg


def test_replicas_per_gpu_excludes_a_count_or_share():
    with pytest.raises(ValidationError, match="do not also give"):
        DeploymentOptions(replicas_per_gpu=4, num_replicas=2)
    with pytest.raises(ValidationError, match="do not also give"):
        DeploymentOptions(replicas_per_gpu=4, num_gpus=0.25)


def test_pools_of_replicas_sharing_a_gpu_must_fit_it():
    bad = {**ONE_PROCESS, "executor": {"pool_limit_fraction": 0.2}}
    with pytest.raises(ValidationError, match=r"8 replicas on one GPU.*1\.600.*0\.118"):
        PipelineConfig.model_validate(bad)
    # a fraction that Ray packs 4 to a GPU, given by hand
    split = {"inference_deployment": {"num_replicas": 4, "num_gpus": 0.25}}
    with pytest.raises(ValidationError, match="4 replicas on one GPU"):
        PipelineConfig.model_validate({**split, "executor": {"pool_limit_fraction": 0.3}})
    PipelineConfig.model_validate({**split, "executor": {"pool_limit_fraction": 0.225}})
    # an absolute limit cannot be checked against a device size here
    PipelineConfig.model_validate({**split, "executor": {"pool_limit_bytes": 1 << 30}})


def test_a_layout_is_refused_when_the_gpu_nodes_lack_cores_or_gpus():
    cfg = placement.resolve(PipelineConfig.model_validate({**ONE_PROCESS, "gpus": 2}), None)
    with pytest.raises(
        ValueError, match=r"16 ingress x 1.0 = 16 CPUs on the GPU nodes, which have 8"
    ):
        placement.check_fits(cfg, [NodeShape("a", 4, 1), NodeShape("b", 4, 1)])
    with pytest.raises(ValueError, match=r"2 GPUs\); the cluster has 1"):
        placement.check_fits(cfg, [NodeShape("a", 64, 1)])
    assert placement.check_fits(cfg, [NodeShape("a", 8, 1), NodeShape("b", 8, 1)]) == []


def test_an_autoscaling_cluster_without_gpu_nodes_yet_is_not_refused():
    cfg = placement.resolve(PipelineConfig.model_validate({**ONE_PROCESS, "gpus": 2}), None)
    (note,) = placement.check_fits(cfg, [NodeShape("head", 16, 0)])
    assert "no GPU node is up" in note


def test_the_split_form_counts_its_gpu_stage_only():
    cfg = PipelineConfig.model_validate(
        {
            "executor": {"pool_limit_fraction": 0.45},
            "ingress_deployment": {
                "num_replicas": 6,
                "num_cpus": 1,
                "label_selector": {"pool": "cpu"},
            },
            "inference_deployment": {"replicas_per_gpu": 2, "num_cpus": 2},
            "gpus": 2,
        }
    )
    assert [s for s, _ in cfg.gpu_stages()] == ["inference"]
    cfg = placement.resolve(cfg, None)
    assert (cfg.inference_deployment.num_replicas, cfg.inference_deployment.num_gpus) == (4, 0.5)
    opts = cfg.ingress_deployment.serve_options()["ray_actor_options"]
    assert opts["label_selector"] == {"pool": "cpu"} and "resources" not in opts
    # the ingress's six CPUs are not asked of the GPU node, but of the cluster as a whole
    placement.check_fits(cfg, [NodeShape("head", 8, 0), NodeShape("gpu", 8, 2)])
    with pytest.raises(ValueError, match="need 16 CPUs in all; the cluster has 9"):
        placement.check_fits(cfg, [NodeShape("head", 1, 0), NodeShape("gpu", 8, 2)])
