"""The stage cores of the pipeline, without Ray Serve (``deployments/`` wraps them).

* ``base``: the ``Stage`` protocol every core follows (``run``, ``check_health``).
* ``messages``: what travels between stages (``Encoded``, ``Rows``, ``RequestMeta``,
  ``PostSpec``).
* ``decode``: ``PreprocessStage``, image bytes -> a uint8 batch on worker threads.
* ``inference``: ``InferenceStage``, the GPU actor (executor + scheduler); decodes in place
  and answers where the placement says so.
* ``postprocess``: ``PostprocessStage``, logits -> softmax, top-k, v2 outputs.
"""
