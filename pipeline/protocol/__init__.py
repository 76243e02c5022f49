"""The Open Inference Protocol (KServe v2) and Triton's extensions, apart from any transport.

* ``v2``: a model's metadata, and an infer request parsed into typed tensors / an answer
  built from the model's outputs (JSON, and the binary tensor extension);
* ``encoded``: the ``<model>_encoded`` views -- a BYTES input of image bytes, run on the
  image path;
* ``triton``: the model configuration, repository index and statistics book Triton
  clients (``tritonclient``, ``perf_analyzer``) read;
* ``validate``: the checks of untrusted fields these share (shapes, counts, numbers).

Why here, inside ``pipeline``, and not a top-level package: it is the same distribution and
builds on ``pipeline.errors`` (each refusal is a typed ``FerryError``) and
``pipeline.engines.base.TensorInfo``; nothing in it imports Ray, Serve, FastAPI or
Starlette, so the HTTP routes (``deployments/``) and any other front (gRPC) call the same
code.
"""
