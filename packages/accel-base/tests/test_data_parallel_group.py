"""`Strategy.data_parallel_group`: a strategy that splits each model over several processes
shards data over its replica group only; `gather_for_metrics` and `reduce` run over it."""

from __future__ import annotations

from conftest import launch

WORKER = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator, set_seed

acc = Accelerator()
set_seed(0)  # the default sampler's generator starts from the global RNG, as in Accelerate
rank = acc.process_index
# Each process alone is one data-parallel replica (as under tensor parallelism over 2 ranks):
# every group must be created on every rank, in the same order.
groups = [dist.new_group([0]), dist.new_group([1])]
acc.strategy.data_parallel_group = lambda: groups[rank]
data = torch.arange(10.0)
dl = acc.prepare(DataLoader(TensorDataset(data), batch_size=4, shuffle=True))
seen = [x for (x,) in dl]
assert len(seen) == 3, [s.tolist() for s in seen]
everyone = [None, None]
dist.all_gather_object(everyone, [s.tolist() for s in seen])
assert everyone[0] == everyone[1], f"both processes of one replica must see the same batches: {everyone}"
got = torch.cat([acc.gather_for_metrics(x) for (x,) in dl])
assert sorted(got.tolist()) == data.tolist(), got.tolist()
total = acc.reduce(torch.tensor(float(rank + 1)), reduction="sum")
assert total.item() == rank + 1, "reduce runs over the replica group only"
# One step of a replica consumed one batch, not one per process: the schedule advances once.
param = torch.nn.Parameter(torch.zeros(1))
opt = torch.optim.SGD([param], lr=1.0)
sched = acc.prepare(torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1)))
sched.step()
assert sched.get_last_lr() == [0.5], sched.get_last_lr()
# Without the hook the same loader is split over both processes.
acc.strategy.data_parallel_group = lambda: None
dl2 = acc.prepare(DataLoader(TensorDataset(data), batch_size=4))
first = [x.tolist() for (x,) in dl2][0]
dist.all_gather_object(everyone, first)
assert everyone == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]], everyone

assert acc.reduce(torch.tensor(1.0), reduction="sum").item() == 2.0
print(f"ok rank={rank}", flush=True)
"""


def test_strategy_data_parallel_group_shards_data_over_replicas_only(write_script) -> None:
    proc = launch(write_script(WORKER), timeout=240)
    assert "ok rank=0" in proc.stdout and "ok rank=1" in proc.stdout
