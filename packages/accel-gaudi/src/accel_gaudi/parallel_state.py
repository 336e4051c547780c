"""`accelerator.mpu` on Gaudi: the process groups of optimum-habana's `context_parallel_size`, with the
`parallel_state` functions its model code calls (`optimum.habana.distributed.parallel_state`).

With a sequence-parallel size `s` over `w` processes (tensor and pipeline parallelism 1, as optimum-habana's
sequence parallelism requires): consecutive ranks `[k*s, (k+1)*s)` form a sequence-parallel group (the chunks of
one sequence), ranks `j, j+s, j+2s, ...` a data-parallel group (one per chunk position), and every process the
sequence-data-parallel group, over which gradients are averaged.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class SequenceParallelState:
    """optimum-habana's `parallel_state` API over this run's groups (built by `build`, on every process)."""

    def __init__(self, sequence_parallel_size: int = 1) -> None:
        self.sequence_parallel_size = sequence_parallel_size
        self._sequence: Any = None
        self._data: Any = None
        self._data_ranks: list[int] = []

    def build(self) -> None:
        """Create the groups (collective: every process calls it, in the same order).

        Raises:
            ValueError: the number of processes is not a multiple of the sequence-parallel size.
        """
        world, rank, size = dist.get_world_size(), dist.get_rank(), self.sequence_parallel_size
        if world % size:
            raise ValueError(
                f"world_size ({world}) is not divisible by sequence_parallel_size {size}: set context_parallel_size "
                "(--context-parallel-size, ACCEL_GAUDI_CONTEXT_PARALLEL_SIZE) to a divisor of the process count."
            )
        for start in range(0, world, size):
            ranks = list(range(start, start + size))
            group = dist.new_group(ranks)
            if rank in ranks:
                self._sequence = group
        for first in range(size):
            ranks = list(range(first, world, size))
            group = dist.new_group(ranks)
            if rank in ranks:
                self._data, self._data_ranks = group, ranks

    # ---- optimum-habana's parallel_state functions ------------------------------------------------
    def is_unitialized(self) -> bool:
        """True before the groups exist (optimum-habana's spelling)."""
        return self._sequence is None

    def model_parallel_is_initialized(self) -> bool:
        return self._sequence is not None

    def sequence_parallel_is_initialized(self) -> bool:
        return self._sequence is not None

    def sequence_data_parallel_is_initialized(self) -> bool:
        return self._sequence is not None

    def get_sequence_parallel_group(self) -> Any:
        """The processes holding the chunks of this process's sequences."""
        self._check()
        return self._sequence

    def get_sequence_parallel_world_size(self) -> int:
        return self.sequence_parallel_size

    def get_sequence_parallel_rank(self) -> int:
        """Which chunk of each sequence this process holds."""
        self._check()
        return int(dist.get_rank(self._sequence))

    def get_sequence_parallel_src_rank(self) -> int:
        """The global rank of the first process of this sequence-parallel group."""
        return (dist.get_rank() // self.sequence_parallel_size) * self.sequence_parallel_size

    def get_data_parallel_group(self) -> Any:
        """The processes holding different batches (one per sequence-parallel group)."""
        self._check()
        return self._data

    def get_data_parallel_world_size(self) -> int:
        self._check()
        return len(self._data_ranks)

    def get_data_parallel_rank(self) -> int:
        self._check()
        return int(dist.get_rank(self._data))

    def get_sequence_data_parallel_group(self) -> Any:
        """Every process: gradients are averaged over sequence and data parallelism together."""
        return dist.group.WORLD

    def get_sequence_data_parallel_world_size(self) -> int:
        return int(dist.get_world_size())

    def get_sequence_data_parallel_rank(self) -> int:
        return int(dist.get_rank())

    def get_model_parallel_group(self) -> Any:
        """optimum-habana's model-parallel group under sequence parallelism: every process."""
        return dist.group.WORLD

    def get_model_parallel_world_size(self) -> int:
        return int(dist.get_world_size())

    def get_model_parallel_rank(self) -> int:
        return int(dist.get_rank())

    def get_tensor_model_parallel_world_size(self) -> int:
        return 1

    def get_tensor_model_parallel_rank(self) -> int:
        return 0

    def get_pipeline_model_parallel_world_size(self) -> int:
        return 1

    def get_pipeline_model_parallel_rank(self) -> int:
        return 0

    def _check(self) -> None:
        if self._sequence is None:
            raise RuntimeError(
                "accelerator.mpu has no groups: set context_parallel_size (--context-parallel-size) above 1 in a "
                "multi-process run to build optimum-habana's sequence-parallel groups."
            )
