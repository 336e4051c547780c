"""Ranks that must see the same data get the same shuffle without `set_seed`.

With the default sampler (`use_seedable_sampler=False`), a `RandomSampler` draws its order from a
generator that rank 0's state is broadcast into at every epoch (Accelerate's `synchronize_rng_states`
on the sampler's generator). When a strategy's data-parallel group is smaller than the world (each
model split over several processes), the processes of one replica must still agree on that order,
though no `set_seed` aligned their global RNGs.
"""

from __future__ import annotations

from conftest import launch

WORKER = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator

acc = Accelerator()
rank = acc.process_index
torch.manual_seed(1234 + 17 * rank)  # the global RNGs differ per rank: no set_seed aligns them
groups = [dist.new_group([0]), dist.new_group([1])]
acc.strategy.data_parallel_group = lambda: groups[rank]  # each process one replica's shard position
data = torch.arange(64.0)
dl = acc.prepare(DataLoader(TensorDataset(data), batch_size=8, shuffle=True))
for epoch in range(2):
    seen = torch.cat([x for (x,) in dl]).tolist()
    assert sorted(seen) == data.tolist(), seen
    assert seen != data.tolist(), "the loader shuffles"
    everyone = [None, None]
    dist.all_gather_object(everyone, seen)
    assert everyone[0] == everyone[1], f"epoch {epoch}: processes of one replica saw different orders: {everyone}"
print(f"ok rank={rank}", flush=True)
"""


def test_replica_ranks_share_the_default_shuffle_without_set_seed(write_script) -> None:
    proc = launch(write_script(WORKER), timeout=240)
    assert "ok rank=0" in proc.stdout and "ok rank=1" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
