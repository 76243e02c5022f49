"""GPU preprocessing: decoded images -> a model's uint8 batch on the device.

* ``plan``: where a fit's host bytes go (pure arithmetic; parts that fit the pinned ring).
* ``fitter``: ``GpuFitter``, the two-phase fit (``prepare`` reserves from the pool and the
  ring, ``commit`` only enqueues the uploads and the one ``ops.resize_crop`` launch).
* ``stage``: ``PreprocessGpuCore``, the stage -- decoding (nvImageCodec or CPU threads),
  batching through the ``BatchScheduler`` when it runs inside the inference replica, and
  the hand-over to the inference replica over a transport when it runs on its own.
* ``rounds``: what a local round hands around (its JPEGs, the retry answer, rows that land).
* ``senders``: ``Senders``, the transports of the hand-over (NCCL, or the object store).
"""
