"""Accelerate's state surface on accel's states: the members Accelerate 1.15.0 has, its error after
`_reset_state()`, pickling, gather of a tensor that requires grad, and `save_state` with a different
`output_dir` on every rank (as Accelerate's own test scripts use them)."""

from __future__ import annotations

import pickle
import re

import pytest
import torch
from accel import Accelerator, DistributedType
from accel.state import AcceleratorState, PartialState, is_initialized
from conftest import launch


def test_is_initialized_follows_the_accelerator_state() -> None:
    assert is_initialized() is False
    Accelerator(cpu=True)
    assert is_initialized() is True
    AcceleratorState._reset_state()
    assert is_initialized() is False


def test_reading_state_after_reset_raises_accelerates_message() -> None:
    acc = Accelerator(cpu=True)
    partial = PartialState()
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"^`AcceleratorState` object has no attribute `mixed_precision`\. "):
        _ = acc.state.mixed_precision
    with pytest.raises(AttributeError, match=r"This happens if `AcceleratorState._reset_state\(\)` was called"):
        acc.prepare(torch.nn.Linear(1, 1))
    with pytest.raises(AttributeError, match=r"^'AcceleratorState' object has no attribute 'not_a_member'$"):
        _ = acc.state.not_a_member
    PartialState._reset_state()
    with pytest.raises(AttributeError, match=r"^`PartialState` object has no attribute `device`\. "):
        _ = partial.device


def test_state_members_accelerate_has() -> None:
    acc = Accelerator(cpu=True)
    state = acc.state
    assert state.fork_launched is False and state.is_fsdp2 is False
    assert state.deepspeed_plugin is None and state.fsdp_plugin is None
    assert state.mixed_precision == "no" and state.use_distributed is False
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    with state.split_between_processes([1, 2, 3]) as share:
        assert share == [1, 2, 3]
    with pytest.raises(ValueError, match="mixed_precision='bf16'"):
        state._check_initialized(mixed_precision="bf16")
    partial = PartialState()
    device = partial.device
    partial.set_device()  # already set: unchanged
    assert partial.device == device


def test_fsdp_plugin_is_none_in_one_process_as_in_accelerate() -> None:
    # Accelerate 1.15 reports DistributedType.NO in one process whatever the FSDP plugin, so `is_fsdp2` is
    # False and `state.fsdp_plugin` None there; with several processes both report FSDP2
    # (test_parallelism_nd.py checks that, and that tensor parallelism alone is not FSDP).
    state = Accelerator(cpu=True, strategy="fsdp2").state
    assert state.distributed_type == DistributedType.NO
    assert state.is_fsdp2 is False and state.fsdp_plugin is None
    assert state.deepspeed_plugin is None


def test_unpickled_state_is_the_live_state() -> None:
    acc = Accelerator(cpu=True)
    copy = pickle.loads(pickle.dumps(acc))
    assert copy.state.__dict__ == acc.state.__dict__
    assert pickle.loads(pickle.dumps(PartialState())).__dict__ is PartialState().__dict__


WORKER = """
import os, sys, tempfile
import torch
from torch.utils.data import DataLoader, TensorDataset
from accel import Accelerator

acc = Accelerator()
rank = acc.process_index
# gather of a tensor that requires grad (Accelerate's gather detaches it)
w = torch.nn.Parameter(torch.full((2,), float(rank)))
got = acc.gather(w * 2)
assert got.tolist() == [0.0, 0.0, 2.0, 2.0] and not got.requires_grad, got
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
with tempfile.TemporaryDirectory() as mine:  # a different directory on every rank, as Accelerate allows
    written = acc.save_state(mine)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.load_state(mine)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "load_state restores"
    listing = sorted(os.listdir(written))
    acc.wait_for_everyone()
print(f"ok rank={rank} files={listing}", flush=True)
"""


def test_gather_requires_grad_and_per_rank_output_dirs(write_script) -> None:
    proc = launch(write_script(WORKER), timeout=240)
    assert "ok rank=0" in proc.stdout and "ok rank=1" in proc.stdout, proc.stdout[-3000:]
    # The checkpoint is whole in one directory: rank 0's, holding both ranks' RNG states.
    # Searched, not split by line: the two ranks' prints may share a line of the launcher's output.
    found = re.search(r"ok rank=0 files=(\[[^\]]*\])", proc.stdout)
    assert found, proc.stdout[-3000:]
    assert "random_states_0.pt" in found[1] and "random_states_1.pt" in found[1], found[1]


def test_an_accelerator_with_launcher_fp8_settings_pickles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Accelerate's test_pickle_accelerator pickles the Accelerator; the fp8 request it holds (read-only
    views of the launcher's fp8 settings) pickles with it and comes back equal."""
    monkeypatch.setenv("ACCEL_FP8_MARGIN", "2")
    acc = Accelerator(cpu=True)
    request = acc._fp8_request
    assert request.get("margin") in (2, "2")
    copy = pickle.loads(pickle.dumps(request))
    assert copy == request and dict(copy.sources) == dict(request.sources)
    pickle.loads(pickle.dumps(acc))
