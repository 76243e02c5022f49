"""The shipped config files: pydantic validation, Ray's cluster-config validation."""

from __future__ import annotations

import copy
import os

import pytest
import yaml
from pydantic import ValidationError

from pipeline import placement
from pipeline.config import DeploymentOptions, ExecutorConfig, PipelineConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name):
    with open(os.path.join(ROOT, name)) as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize(
    "name", ["serve_config.yaml", "serve_config.gpu.yaml", "serve_config.gpu2.yaml"]
)
def test_serve_configs_validate(name):
    from ray.serve.schema import ServeDeploySchema

    raw = _load(name)
    ServeDeploySchema.model_validate(raw)  # Serve's own schema, as `serve deploy` checks it
    (app,) = raw["applications"]
    assert app["import_path"] == "deployments.app:build_app"
    cfg = PipelineConfig.model_validate(app["args"]["config"])
    cfg = placement.resolve(cfg, 1)  # as built on a node with one GPU
    assert {m.name for m in cfg.models} == {"digits", "resnet50"}
    if name == "serve_config.yaml":
        assert cfg.executor.backend == "numpy" and raw["http_options"]["host"] == "127.0.0.1"
        total = sum(
            getattr(cfg, f"{s}_deployment").num_cpus
            for s in ("ingress", "preprocess", "inference", "postprocess")
        )
        assert total <= 2.0  # fits a two-core laptop
    else:  # the deployment that holds the GPU: the ingress when it runs the whole pipeline
        inf = getattr(cfg, f"{cfg.placement_row.executor_in}_deployment")
        assert cfg.executor.backend == "cupy" and inf.num_gpus * inf.num_replicas >= 1
    if name == "serve_config.gpu.yaml":  # the measured form: one deployment, decode on its GPU
        assert cfg.placement == "one_process" and cfg.decodes_on_gpu
        assert cfg.executor.pool_limit_fraction * inf.num_replicas <= 0.95  # pools share one GPU
    if name == "serve_config.gpu2.yaml":
        assert cfg.placement == "gpu_preprocess" and cfg.preprocess_deployment.num_gpus == 1


def test_cluster_yaml_passes_rays_validation():
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = _load("cluster.yaml")
    prepared = prepare_config(copy.deepcopy(raw))  # fills defaults, as `ray up` does
    validate_config(prepared)
    types = raw["available_node_types"]
    assert "GPU" not in types[raw["head_node_type"]]["resources"]
    assert any(t["resources"].get("GPU", 0) >= 1 for t in types.values())
    assert any("cuda" in c for c in raw["worker_setup_commands"])
    broken = copy.deepcopy(prepared)
    broken["available_node_types"]["gpu_worker"]["min_workers"] = "lots"
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        validate_config(broken)


def test_pipeline_config_cross_checks_name_the_values():
    with pytest.raises(ValidationError, match="'max_batch_size' is no longer a setting: a batch"):
        PipelineConfig.model_validate({"batching": {"max_batch_size": 512}})
    with pytest.raises(ValidationError, match="max_request_rows .9. exceeds batching.max_queue"):
        PipelineConfig.model_validate({"ingress": {"max_request_rows": 9}, "batching": {"max_queue": 8}})
    with pytest.raises(ValidationError, match="unique"):
        PipelineConfig.model_validate(
            {"models": [{"name": "a", "arch": "digits"}, {"name": "a", "arch": "digits"}]}
        )
    with pytest.raises(ValidationError, match="not both"):
        DeploymentOptions(num_replicas=2, autoscaling_config={"min_replicas": 1})
    with pytest.raises(ValidationError):
        ExecutorConfig(buckets=(4, 2))
    with pytest.raises(ValidationError):
        ExecutorConfig(max_in_flight=0)
    with pytest.raises(ValidationError):
        PipelineConfig.model_validate({"no_such_field": 1})


def test_deployment_options_map_to_serve():
    o = DeploymentOptions(
        num_replicas=None,
        autoscaling_config={"min_replicas": 1, "max_replicas": 4},
        num_gpus=0.5,
        env_vars={"A": "1"},
    ).serve_options()
    assert o["autoscaling_config"]["max_replicas"] == 4 and "num_replicas" not in o
    assert o["ray_actor_options"] == {
        "num_cpus": 1.0,
        "num_gpus": 0.5,
        "runtime_env": {
            "env_vars": {"A": "1", "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1)}
        },
    }
    # the user's own value for the gRPC limit wins over Ferry's
    own = {"RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": "1000"}
    o = DeploymentOptions(env_vars=own).serve_options()
    assert o["ray_actor_options"]["runtime_env"]["env_vars"] == own


def _bound(app) -> dict:
    """The deployments of a built application by name, with the handles each was given."""
    out, todo = {}, [app._bound_deployment]
    while todo:
        d = todo.pop()
        out[d.name] = d
        todo += [h._bound_deployment for h in _handles(d).values()]
    return out


def _handles(d) -> dict:
    """The handles a bound deployment was given, by stage name (its other kwargs are the
    composition root's choices: ``way``, ``decode_here``, ``answer_here``)."""
    return {k: v for k, v in d.init_kwargs.items() if hasattr(v, "_bound_deployment")}


def test_every_placement_builds_the_deployments_its_row_names():
    from deployments.app import build
    from pipeline.config import PLACEMENTS
    gpu = {
        "preprocess_deployment": {"num_gpus": 1},
        "inference_deployment": {"num_gpus": 1},
    }
    names = {
        "four_stage": {"Ingress", "Preprocess", "Inference", "Postprocess"},
        "one_process": {"Ingress"},
        "split": {"Ingress", "Inference"},
        "gpu_preprocess": {"Ingress", "PreprocessGPU", "Inference"},
    }
    for name in PLACEMENTS:
        cfg = PipelineConfig.model_validate(
            {"placement": name, **(gpu if name == "gpu_preprocess" else {})}
        )
        bound = _bound(build(cfg))
        assert set(bound) == names[name], name
        assert len(bound) == len(PLACEMENTS[name].deployments)
        ingress = bound["Ingress"]
        assert ingress.init_args[1:] == ()  # handles by stage name only
    bound = _bound(build(PipelineConfig.model_validate({"placement": "gpu_preprocess", **gpu})))
    # inference drives PreprocessGPU; it answers, and decodes nothing itself
    assert bound["Inference"].init_kwargs["decode_here"] is False
    assert bound["Inference"].init_kwargs["answer_here"] is True
    assert set(_handles(bound["Inference"])) == {"preprocess"}
    assert set(_handles(bound["Ingress"])) == {"inference"}
    assert bound["Ingress"].init_kwargs["way"] == "hop"
    assert bound["PreprocessGPU"].ray_actor_options["num_gpus"] == 1


def test_placement_is_validated_with_its_cross_field_rules():
    with pytest.raises(ValidationError, match="placement"):
        PipelineConfig.model_validate({"placement": "preprocess_in_ingress"})
    with pytest.raises(ValidationError, match="'fusion' is no longer a setting: placement"):
        PipelineConfig.model_validate({"fusion": {"inference_in_ingress": True}})  # gone
    with pytest.raises(ValidationError, match="gpu_preprocess.*num_gpus is 0.0"):
        PipelineConfig.model_validate({"placement": "gpu_preprocess"})
    with pytest.raises(ValidationError):
        PipelineConfig.model_validate({"preprocess": {"decoder": "libjpeg-on-a-toaster"}})
    for share in (0, 1.5):  # the hardware engines' share of a decode call: (0, 1]
        with pytest.raises(ValidationError, match="gpu_decode_hw_load"):
            PipelineConfig.model_validate({"preprocess": {"gpu_decode_hw_load": share}})
    ok = {"gpu_decode_backend": "hardware", "gpu_decode_hw_load": 0.6}
    assert PipelineConfig.model_validate({"preprocess": ok}).preprocess.gpu_decode_hw_load == 0.6
    with pytest.raises(ValidationError):
        PipelineConfig.model_validate({"transport": {"timeout_s": 0}})
    # a form that decodes on the executor's GPU cannot 'fit' (a CPU-only resize)
    fit = [{"name": "d", "source": "digits", "input": {"resize": "fit"}}]
    with pytest.raises(ValidationError, match="resize 'fit'"):
        PipelineConfig.model_validate(
            {"placement": "split", "models": fit, "inference_deployment": {"num_gpus": 1}}
        )
    ok = PipelineConfig.model_validate({"placement": "split", "models": fit})  # CPU decode
    assert not ok.decodes_on_gpu
    assert PipelineConfig(placement="one_process").placement_row.executor_in == "ingress"


def test_ingress_coalescers_are_bounded_by_max_groups_in_flight():
    """The ingress's coalescers get the configured bound: with it, a group waits for a free
    slot and grows under load instead of leaving every window (a call per request)."""
    from deployments.ingress import Ingress

    cfg = PipelineConfig.model_validate({"ingress": {"max_groups_in_flight": 3, "max_coalesce": 7}})
    # the class as written (Serve's ingress wrapper subclasses it with an async __init__)
    cls = next(k for k in Ingress.func_or_class.__mro__ if "_coalescer" in k.__dict__)
    ingress = cls.__new__(cls)
    cls.__init__(ingress, cfg.model_dump(mode="json"))
    c = ingress._coalescer(cfg.models[0].name, "classify")
    assert c.max_in_flight == 3 and c.max_items == 7
    assert ingress._coalescer(cfg.models[0].name, "v2").max_in_flight == 3


def test_switch_interval_is_applied_in_the_replica_process_and_bounded():
    import sys

    before = sys.getswitchinterval()
    try:
        DeploymentOptions(switch_interval_ms=0.5).apply_in_process()
        assert sys.getswitchinterval() == pytest.approx(0.0005)
        DeploymentOptions().apply_in_process()  # None keeps whatever the process has
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    finally:
        sys.setswitchinterval(before)
    with pytest.raises(ValidationError):
        DeploymentOptions(switch_interval_ms=0)
    assert "switch_interval_ms" not in str(DeploymentOptions(switch_interval_ms=1).serve_options())


def test_gc_thresholds_are_set_in_the_replica_process_by_default_and_bounded():
    import gc

    before = gc.get_threshold()
    try:
        DeploymentOptions().apply_in_process()  # the default: fewer young collections
        assert gc.get_threshold() == (10_000, 10, 10)
        DeploymentOptions(gc_threshold=(5000, 20, 30)).apply_in_process()
        assert gc.get_threshold() == (5000, 20, 30)
        gc.set_threshold(*before)
        DeploymentOptions(gc_threshold=None).apply_in_process()  # None: the process's own
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)
    with pytest.raises(ValidationError):
        DeploymentOptions(gc_threshold=(0, 10, 10))  # 0 would turn the collector off
    assert "gc_threshold" not in str(DeploymentOptions().serve_options())


def test_one_process_holds_the_gpu_in_the_ingress_and_its_pools_must_fit():
    from deployments.app import build

    # the GPU share is the ingress's: eight replicas share the GPU, so their pools must fit
    share = {"placement": "one_process", "ingress_deployment": {"num_gpus": 0.125}}
    with pytest.raises(ValidationError, match="8 replicas on one GPU"):
        PipelineConfig.model_validate(share)
    cfg = PipelineConfig.model_validate({**share, "executor": {"pool_limit_fraction": 0.118}})
    assert cfg.decodes_on_gpu
    ingress = build(cfg)._bound_deployment
    assert ingress.name == "Ingress" and _handles(ingress) == {}  # no deployment below it
    assert ingress.init_kwargs == {"way": "in_process"}
    assert ingress.ray_actor_options["num_gpus"] == 0.125


def test_serves_logging_config_applies_unless_the_pipeline_sets_one():
    from deployments.app import build

    assert build(PipelineConfig())._bound_deployment._deployment_config.logging_config is None
    app = build(PipelineConfig(log_encoding="JSON"))
    got = app._bound_deployment._deployment_config.logging_config  # the ingress; the rest alike
    assert got["encoding"] == "JSON" and got["log_level"] == "INFO"
    assert got["enable_access_log"] is False
    cfg = PipelineConfig(access_log=True, log_level="WARNING")
    assert cfg.serve_logging_config() == {
        "enable_access_log": True,
        "log_level": "WARNING",
        "encoding": "TEXT",
    }


def test_field_docstrings_reach_the_json_schema():
    """Each field's docstring is its description in the schema (editors, `serve` tooling)."""
    schema = PipelineConfig.model_json_schema()
    ex = schema["$defs"]["ExecutorConfig"]["properties"]
    assert "hard limit of the device pool" in ex["pool_limit_fraction"]["description"].lower()
    dep = schema["$defs"]["DeploymentOptions"]["properties"]
    assert "replicas on each gpu" in dep["replicas_per_gpu"]["description"].lower()
    undocumented = [
        f"{name}.{field}"
        for name, d in [("PipelineConfig", schema), *schema["$defs"].items()]
        for field, p in d.get("properties", {}).items()
        if not p.get("description")
    ]
    assert undocumented == [], undocumented


@pytest.mark.parametrize(
    "raw, where, says",
    [
        ({"batching": {"dispatch_when_idle": False}}, "batching", "always leaves at once"),
        ({"ingress": {"dispatch_when_idle": True}}, "ingress", "always leaves at once"),
        ({"executor": {"cuda_graphs": False}}, "executor", "executor.mode replaced it"),
        ({"fusion": {"inference_in_ingress": True}}, "", "placement replaced it"),
        ({"warmup": False}, "", "always warm up"),
    ],
)
def test_a_removed_setting_is_refused_naming_what_replaced_it(raw, where, says):
    key = next(iter(raw[where])) if where else next(iter(raw))
    with pytest.raises(ValidationError) as info:
        PipelineConfig.model_validate(raw)
    (err,) = info.value.errors()
    assert err["loc"] == ((where,) if where else ())
    assert f"{key!r} is no longer a setting" in err["msg"] and says in err["msg"]
    assert "Extra inputs" not in str(info.value)
    with pytest.raises(ValidationError, match="Extra inputs"):  # other unknown keys as before
        PipelineConfig.model_validate({where: {"no_such": 1}} if where else {"no_such": 1})


def test_a_models_batch_sizes_have_one_owner_its_model_batch():
    cfg = PipelineConfig.model_validate(
        {
            "models": [
                {"name": "small", "arch": "digits", "max_batch": 6},  # cut at 4: no bucket of 6
                {"name": "own", "arch": "digits", "buckets": [3, 12]},
                {"name": "plain", "arch": "digits"},
            ],
            "executor": {"backend": "numpy", "buckets": [1, 2, 4, 8]},
        }
    )
    assert cfg.batch_of("small").buckets == (1, 2, 4) and cfg.batch_of("small").max_batch == 4
    assert cfg.batch_of("own").buckets == (3, 12)
    assert cfg.batch_of("plain").max_batch == 8
    assert cfg.largest_batch == 12
    assert cfg.request_rows == cfg.batching.max_queue  # ingress.max_request_rows unset
    with pytest.raises(ValidationError, match="strictly increasing"):
        PipelineConfig.model_validate({"models": [{"name": "x", "arch": "digits", "buckets": [4, 2]}]})
    with pytest.raises(ValidationError, match="max_batch 1 is below the smallest bucket 3"):
        PipelineConfig.model_validate(
            {"models": [{"name": "x", "arch": "digits", "buckets": [3], "max_batch": 1}]}
        )
