"""Answers beyond class labels: a model's task (``spec``: classify, image, segment, detect,
tensors), what a request asks of it (``options``), the answers made from a call's outputs
(``answers``, ``detect``) and their encoding (``encode``). The ops they run are Ferry's own
(``pipeline/ops/denormalize.py``, ``mask.py``, ``nms.py``, ``resize_crop.py``)."""
