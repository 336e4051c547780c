"""Processes: their shared state (`state`), collectives (`ops`), nested-tensor helpers (`tree`), RNG kept equal
across ranks (`rng`), debug checks (`debug`), what a launcher told this process (`launch_env`) and the
`DistributedType` names (`distributed_type`)."""
