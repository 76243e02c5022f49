"""Moving tensors between actors: NCCL, the Ray object store, in-process."""
