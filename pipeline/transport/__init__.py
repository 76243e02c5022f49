"""Moving tensors between actors: the channel interface (base), NCCL, the Ray object store."""
