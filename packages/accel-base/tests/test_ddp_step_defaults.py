"""accel's DDP is the DDP a user would build by hand with gradient_as_bucket_view=True.

The step benchmark (benchmarks/step_bench.py) compares against exactly that; these tests keep
the settings from drifting apart again (an explicit bucket_cap_mb=25 once made accel's first
gradient bucket 25 MB instead of DDP's 1 MB, 12-15% slower steps at hidden 512-2048).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from accel.settings.kwargs import DistributedDataParallelKwargs
from accel.state import AcceleratorState
from torch.nn.parallel import DistributedDataParallel as DDP


def test_default_kwargs_leave_bucket_sizes_to_ddp() -> None:
    kwargs = DistributedDataParallelKwargs().ddp_kwargs()
    assert "bucket_cap_mb" not in kwargs
    assert kwargs["gradient_as_bucket_view"] is True


def test_changed_bucket_size_is_passed() -> None:
    assert DistributedDataParallelKwargs(bucket_cap_mb=1).ddp_kwargs()["bucket_cap_mb"] == 1
    assert DistributedDataParallelKwargs(bucket_cap_mb=100).ddp_kwargs()["bucket_cap_mb"] == 100


def test_ddp_built_from_defaults_has_a_hand_built_ddps_buckets(tmp_path) -> None:
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Linear(8, 8)
        ours = DDP(model, **DistributedDataParallelKwargs().ddp_kwargs())
        by_hand = DDP(torch.nn.Linear(8, 8), gradient_as_bucket_view=True)
        for name in ("bucket_bytes_cap", "bucket_bytes_cap_default", "gradient_as_bucket_view", "static_graph"):
            assert getattr(ours, name) == getattr(by_hand, name), name
        # DDP's small first bucket (1 MB) is what an explicit bucket_cap_mb turns off.
        assert ours.bucket_bytes_cap_default is True
        assert DDP(torch.nn.Linear(8, 8), bucket_cap_mb=25).bucket_bytes_cap_default is False
    finally:
        dist.destroy_process_group()


def test_state_adapter_without_an_initialised_state_is_an_attribute_error() -> None:
    state = AcceleratorState.__new__(AcceleratorState)
    assert not hasattr(state, "adapter")
