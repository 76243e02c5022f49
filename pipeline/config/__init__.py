"""Pydantic configuration of a whole Ferry pipeline, one section a module.

Bounds are enforced with ``Field(ge=..., le=...)``; cross-field checks raise ``ValueError``
naming the values. Every field's docstring is its description in the JSON schema
(``use_attribute_docstrings``). Process-level switches come from the environment, read in
``Settings.from_env`` and nowhere else.

- ``runtime``: ``ExecutorConfig`` (device, pool, streams, buckets), ``BatchingConfig``
- ``faults``: ``FaultConfig`` (``executor.faults``: injected faults)
- ``health``: ``HealthConfig`` (what fails a replica's health check)
- ``deployment``: ``DeploymentOptions`` (Serve options of one stage)
- ``models``: ``ModelConfig``, ``ModelInputConfig``
- ``tasks``: ``TaskOutputConfig`` (``output:``: how a model's output is read for its task)
- ``placements``: ``PLACEMENTS``, the rows ``PipelineConfig.placement`` names
- ``stages``: ``IngressConfig``, ``PreprocessConfig``, ``TransportConfig``, ``StreamsConfig``
- ``pipeline``: ``PipelineConfig`` (the whole application, cross-field rules), ``Settings``

A leaf: the models validate shapes and values only, and import nothing of Ferry's. What
needs an engine, a file or the cluster -- the engine named, the model, weights and labels
files, ``replicas_per_gpu`` against the cluster's GPUs, the nodes' cores, the models' load
-- is ``pipeline.check.check(config, cluster)``'s, one step run by the application's build,
``ferry config check`` and the tests.
"""

from .base import Strict
from .deployment import GRPC_LIMIT_ENV, DeploymentOptions, replicas_sharing_a_gpu
from .faults import Fault, FaultConfig
from .health import HealthConfig
from .models import BUILTIN_ARCHS, MODEL_FILE_SUFFIXES, ModelBatch, ModelConfig, ModelInputConfig
from .pipeline import POOL_SHARE_LIMIT, PipelineConfig, Settings
from .placements import PLACEMENTS, Placement, PlacementName
from .runtime import DEFAULT_BUCKETS, BatchingConfig, ExecutorConfig
from .stages import IngressConfig, PreprocessConfig, StreamsConfig, TransportConfig
from .tasks import TASKS, TaskName, TaskOutputConfig

__all__ = [
    "BUILTIN_ARCHS",
    "DEFAULT_BUCKETS",
    "GRPC_LIMIT_ENV",
    "MODEL_FILE_SUFFIXES",
    "POOL_SHARE_LIMIT",
    "BatchingConfig",
    "DeploymentOptions",
    "ExecutorConfig",
    "Fault",
    "FaultConfig",
    "HealthConfig",
    "PLACEMENTS",
    "Placement",
    "PlacementName",
    "IngressConfig",
    "ModelBatch",
    "ModelConfig",
    "ModelInputConfig",
    "PipelineConfig",
    "PreprocessConfig",
    "Settings",
    "Strict",
    "StreamsConfig",
    "TASKS",
    "TaskName",
    "TaskOutputConfig",
    "TransportConfig",
    "replicas_sharing_a_gpu",
]
