"""deploy/: the container recipe, the KubeRay RayService and cluster.yaml's image and settings."""

from __future__ import annotations

import os
import re
import shlex

import tomllib
import yaml

from pipeline.config import PipelineConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVE_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}


def _text(name: str) -> str:
    with open(os.path.join(ROOT, name)) as f:
        return f.read()


def _pyproject() -> dict:
    return tomllib.loads(_text("pyproject.toml"))


def _ray_pin() -> str:
    (dep,) = [d for d in _pyproject()["project"]["dependencies"] if d.startswith("ray[")]
    return re.search(r"==\s*([\d.]+)\.\*", dep).group(1)  # "2.60"


def _dockerfile() -> list[str]:
    """Instructions, continuation lines joined, comments dropped."""
    out, cur = [], ""
    for line in _text("deploy/Dockerfile").splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        cur += line.rstrip("\\").strip() + " "
        if not line.rstrip().endswith("\\"):
            out.append(cur.strip())
            cur = ""
    return out


def _extras(command: str) -> set[str]:
    """The extras a ``pip install '.[a,b]'`` (or ``-e '.[a,b]'``) command names."""
    return set(re.search(r"'\.\[([^\]]+)\]'", command).group(1).split(","))


def _shipped_gpu() -> tuple[dict, PipelineConfig]:
    """serve_config.gpu.yaml as read, and its application's pipeline config validated."""
    gpu = yaml.safe_load(_text("serve_config.gpu.yaml"))
    return gpu, PipelineConfig.model_validate(gpu["applications"][0]["args"]["config"])


def test_dockerfile_base_image_is_rays_gpu_image_for_the_pinned_version():
    import ray

    ins = _dockerfile()
    (arg,) = [i for i in ins if i.startswith("ARG RAY_IMAGE=")]
    image = arg.split("=", 1)[1]
    m = re.fullmatch(r"rayproject/ray:(\d+\.\d+)\.\d+-py311-cu12\d", image)
    assert m, image  # Ray's CUDA 12 image, the Python this repository is tested on
    assert m.group(1) == _ray_pin() and ray.__version__.startswith(m.group(1) + ".")
    assert "FROM ${RAY_IMAGE}" in ins


def test_dockerfile_copies_files_that_exist_and_installs_real_extras():
    ins = _dockerfile()
    copies = [shlex.split(i)[1:] for i in ins if i.startswith("COPY ")]
    assert copies
    for parts in copies:
        srcs = [p for p in parts if not p.startswith("--")][:-1]
        assert srcs
        for src in srcs:
            assert os.path.exists(os.path.join(ROOT, src)), src
    (pip,) = [i for i in ins if "pip install" in i]
    extras = _extras(pip)
    defined = _pyproject()["project"]["optional-dependencies"]
    assert extras <= set(defined), extras
    assert {"cuda12", "gpu-decode-cu12"} <= extras
    assert any(d.startswith("nvidia-nvimgcodec-cu12") for d in defined["gpu-decode-cu12"])
    (cmd,) = [i for i in ins if i.startswith("CMD ")]
    for name in re.findall(r"serve_config[\w.]*\.yaml", cmd):
        assert os.path.exists(os.path.join(ROOT, name))
    env = " ".join(i for i in ins if i.startswith("ENV "))
    for k, v in SERVE_ENV.items():
        assert f"{k}={v}" in env


def _rayservice() -> dict:
    return yaml.safe_load(_text("deploy/kuberay/rayservice.yaml"))


def test_rayservice_serve_config_validates_and_is_the_gpu_config():
    from ray.serve.schema import ServeDeploySchema

    rs = _rayservice()
    assert rs["apiVersion"] == "ray.io/v1" and rs["kind"] == "RayService"
    serve_cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])  # a YAML string, as KubeRay wants
    ServeDeploySchema.model_validate(serve_cfg)
    (app,) = serve_cfg["applications"]
    cfg = PipelineConfig.model_validate(app["args"]["config"])
    gpu = yaml.safe_load(_text("serve_config.gpu.yaml"))
    assert serve_cfg == gpu  # the same file: one edit does not leave the other behind
    assert cfg.executor.backend == "cupy" and cfg.ingress_deployment.holds_gpu


def test_rayservice_pods_run_the_image_with_serves_two_variables():
    spec = _rayservice()["spec"]["rayClusterConfig"]
    assert spec["rayVersion"].startswith(_ray_pin() + ".")
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    gpus = 0
    for g in groups:
        (c,) = g["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in c["env"]}
        assert {k: env.get(k) for k in SERVE_ENV} == SERVE_ENV
        assert c["image"] == "ferry:0.1.0"  # what deploy/Dockerfile's comment builds
        gpus += int(c["resources"]["limits"].get("nvidia.com/gpu", 0)) * g.get("replicas", 1)
    serve_cfg = yaml.safe_load(_rayservice()["spec"]["serveConfigV2"])
    d = PipelineConfig.model_validate(serve_cfg["applications"][0]["args"]["config"])
    assert d.ingress_deployment.num_gpus * d.ingress_deployment.num_replicas <= gpus


def test_cluster_yaml_names_cuda_images_and_the_throughput_setting():
    raw = yaml.safe_load(_text("cluster.yaml"))
    docker = raw["docker"]
    assert re.fullmatch(
        rf"rayproject/ray:{re.escape(_ray_pin())}\.\d+-py311-cu12\d", docker["worker_image"]
    )
    assert docker["head_image"].startswith(f"rayproject/ray:{_ray_pin()}.")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in raw[key] if "ray start" in c]
        assert starts and all(f"{k}={v}" in c for c in starts for k, v in SERVE_ENV.items())
    (worker_setup,) = raw["worker_setup_commands"]
    assert "cuda12" in worker_setup and "gpu-decode-cu12" in worker_setup


def test_the_image_and_the_cluster_install_what_the_shipped_gpu_configs_engines_need():
    """A model on the torch engine needs torch (and torchvision for an architecture name);
    the image and cluster.yaml's GPU workers must install that extra, or the shipped config
    fails at its first replica's load."""
    _, cfg = _shipped_gpu()
    need = set()
    for m in cfg.models:
        if m.engine == "torch":
            need.add("torchvision" if m.source_file is None and ":" not in m.source else "torch")
        elif m.engine == "onnx":
            need.add("onnx")
    assert need  # the shipped config's ResNet-50 is on the torch engine
    (pip,) = [i for i in _dockerfile() if "pip install" in i]
    (worker_setup,) = yaml.safe_load(_text("cluster.yaml"))["worker_setup_commands"]
    for command in (pip, worker_setup):
        assert need <= _extras(command), command


def test_the_gpu_pods_and_the_image_expose_the_shipped_configs_listener_port():
    gpu, cfg = _shipped_gpu()
    port = cfg.ingress.direct_port
    assert port is not None and port != gpu["http_options"]["port"]
    (expose,) = [i for i in _dockerfile() if i.startswith("EXPOSE ")]
    assert str(port) in expose.split()[1:]
    spec = _rayservice()["spec"]["rayClusterConfig"]
    for g in spec["workerGroupSpecs"]:  # the replicas (GPU shares) run on the worker pods
        (c,) = g["template"]["spec"]["containers"]
        ports = {p["containerPort"]: p["name"] for p in c["ports"]}
        assert ports.get(port) == "direct"
        assert len(set(ports)) == len(c["ports"])  # no port named twice (8080: Ray's metrics)
