"""Ferry on Ray Serve: ingress, preprocessing, inference and postprocessing deployments.

Importing the package (every replica does, to find its deployment class) makes this
process's Ferry metrics with ``ray.serve.metrics``: inside a replica they then carry Serve's
``deployment``, ``replica`` and ``application`` labels, so per-replica gauges stay apart and
Serve users find Ferry's series beside Serve's own. ``pipeline/`` never imports
``ray.serve`` itself; it is handed the classes here (``pipeline.metrics.use_metric_classes``).
Outside a replica ``ray.serve.metrics`` adds no labels and behaves as ``ray.util.metrics``.
"""

from ray.serve import metrics as _serve_metrics

from pipeline import metrics as _metrics

_metrics.use_metric_classes(_serve_metrics)
