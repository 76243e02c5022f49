"""Pydantic configuration of a whole Ferry pipeline, one section a module.

Bounds are enforced with ``Field(ge=..., le=...)``; cross-field checks raise ``ValueError``
naming the values. Every field's docstring is its description in the JSON schema
(``use_attribute_docstrings``). Process-level switches come from the environment, read in
``Settings.from_env`` and nowhere else.

- ``runtime``: ``ExecutorConfig`` (device, pool, streams, buckets), ``BatchingConfig``
- ``deployment``: ``DeploymentOptions`` (Serve options of one stage)
- ``models``: ``ModelConfig``, ``ModelInputConfig``
- ``forms``: ``FORMS``, the placements (``PipelineConfig.placement`` names one)
- ``stages``: ``IngressConfig``, ``PreprocessConfig``, ``TransportConfig``
- ``pipeline``: ``PipelineConfig`` (the whole application, cross-field rules), ``Settings``
"""

from .base import Strict
from .deployment import GRPC_LIMIT_ENV, DeploymentOptions
from .forms import FORMS, Form, Placement
from .models import BUILTIN_ARCHS, MODEL_FILE_SUFFIXES, ModelConfig, ModelInputConfig
from .pipeline import PipelineConfig, Settings
from .runtime import DEFAULT_BUCKETS, BatchingConfig, ExecutorConfig
from .stages import IngressConfig, PreprocessConfig, TransportConfig

__all__ = [
    "BUILTIN_ARCHS",
    "DEFAULT_BUCKETS",
    "GRPC_LIMIT_ENV",
    "MODEL_FILE_SUFFIXES",
    "BatchingConfig",
    "DeploymentOptions",
    "ExecutorConfig",
    "FORMS",
    "Form",
    "Placement",
    "IngressConfig",
    "ModelConfig",
    "ModelInputConfig",
    "PipelineConfig",
    "PreprocessConfig",
    "Settings",
    "Strict",
    "TransportConfig",
]
