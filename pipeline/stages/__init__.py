"""The stage cores of the pipeline, without Ray Serve (``deployments/`` wraps them).

* ``base``: the ``Stage`` protocol every core follows (``run``, ``check_health``).
* ``messages``: what travels between stages, typed: ``Encoded`` (checked image bytes),
  ``HostRows`` / ``DeviceRows`` (a call's rows in host memory or in a device pool),
  ``SendTo`` (where PreprocessGPU sends a batch), ``Logits``, ``RequestMeta``, ``PostSpec``,
  the ingress's ``ImageRequest`` / ``TensorRequest``, and each request's ``Answer`` with its
  ``Timings`` (per-stage ms, when its group left the coalescer, the Serve ``Hop``).
* ``decode``: ``PreprocessStage``, image bytes -> a uint8 batch on worker threads.
* ``inference``: ``InferenceStage``, the GPU actor (executor + scheduler); decodes in place
  and answers where the placement says so.
* ``postprocess``: ``PostprocessStage``, logits -> softmax, top-k, v2 outputs.
"""
