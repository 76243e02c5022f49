"""Ferry runtime: device, memory, operators, graphs, executor, batching. Never imports ray.serve."""
