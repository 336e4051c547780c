"""Accelerate's surface outside the training loop: logging, launchers, utils, samplers, RNG sync.

Each behaviour is checked against a reference computed another way (torch's own sampler,
a hand-computed reduction, files the worker processes write).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.data_loader import SeedableRandomSampler, prepare_data_loader
from accel.logging import get_logger
from accel.state import PartialState
from accel.utils import (
    find_executable_batch_size,
    listify,
    patch_environment,
    release_memory,
    send_to_device,
    tqdm,
)
from conftest import launch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset


def _run(code: str, tmp_path: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "main.py"
    script.write_text(code)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(script), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


# ---- launchers: real processes ------------------------------------------------------------
LAUNCHED = """
import socket, sys
from pathlib import Path
import torch
from accel import Accelerator, {launcher}

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

out = Path(sys.argv[1])

def train(scale):
    accelerator = Accelerator()
    total = accelerator.reduce(torch.tensor([float(accelerator.process_index + 1)]), "sum")
    (out / f"rank{{accelerator.process_index}}.txt").write_text(
        f"{{accelerator.num_processes}} {{total.item() * scale}} {{accelerator.mixed_precision}}"
    )

if __name__ == "__main__":
    {call}
"""


@pytest.mark.parametrize(
    ("launcher", "call"),
    [
        ("debug_launcher", "debug_launcher(train, args=(10,), num_processes=2)"),
        (
            "notebook_launcher",
            "notebook_launcher(train, (10,), num_processes=2, mixed_precision='bf16', use_port=str(free_port()))",
        ),
    ],
)
def test_launchers_start_real_processes_that_form_one_group(tmp_path: Path, launcher: str, call: str) -> None:
    _run(LAUNCHED.format(launcher=launcher, call=call), tmp_path)
    precision = "bf16" if launcher == "notebook_launcher" else "no"
    for rank in (0, 1):
        # 1 + 2 summed over the two processes, times the argument passed through.
        assert (tmp_path / f"rank{rank}.txt").read_text() == f"2 30.0 {precision}"


def test_a_worker_that_returns_without_its_state_does_not_leave_a_peer_waiting(tmp_path: Path) -> None:
    # As in Accelerate's test_notebook fault-tolerance case: in the last restarted round one worker
    # has nothing left to do and returns while the other creates its state (forming the group).
    code = """
import os, socket, sys
from pathlib import Path
from accel import PartialState, notebook_launcher

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

def work(out):
    if os.environ["LOCAL_RANK"] == "1":
        return
    state = PartialState()
    (Path(out) / "rank0.txt").write_text(f"{state.num_processes} {state.process_index}")

if __name__ == "__main__":
    notebook_launcher(work, (sys.argv[1],), num_processes=2, use_port=str(free_port()))
"""
    _run(code, tmp_path, timeout=120)  # without the fix rank 0 waits for rank 1 until the group's timeout
    assert (tmp_path / "rank0.txt").read_text() == "2 0"


def test_launchers_refuse_an_accelerator_created_before(tmp_path: Path) -> None:
    code = """
from accel import Accelerator, debug_launcher
Accelerator()
try:
    debug_launcher(print, num_processes=2)
except ValueError as e:
    print("refused:", e)
"""
    assert "must only be created inside the launched function" in _run(code, tmp_path).stdout


# ---- logging ----------------------------------------------------------------------------------
LOGGING = """
import logging, sys
from accel import Accelerator
from accel.logging import get_logger

logging.basicConfig(format="%(levelname)s %(message)s", stream=sys.stdout)
logger = get_logger("surface")
acc = Accelerator()
logger.info("once")
logger.info("everyone %d", acc.process_index, main_process_only=False)
logger.info("ordered", in_order=True)
logger.debug("hidden")
"""


def test_get_logger_logs_once_or_everywhere_and_reads_the_level_from_the_environment(write_script) -> None:
    proc = launch(write_script(LOGGING), env={"ACCELERATE_LOG_LEVEL": "info"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("INFO")]
    assert lines.count("INFO [RANK 0] once") == 1 and not any("[RANK 1] once" in x for x in lines)
    assert {"INFO [RANK 0] everyone 0", "INFO [RANK 1] everyone 1"} <= set(lines)
    assert {"INFO [RANK 0] ordered", "INFO [RANK 1] ordered"} <= set(lines)
    assert "hidden" not in proc.stdout


def test_get_logger_needs_the_state_and_takes_an_explicit_level() -> None:
    logger = get_logger("surface.level", log_level="warning")
    assert logger.logger.level == logging.WARNING
    PartialState._reset_state()
    with pytest.raises(RuntimeError, match="create `PartialState"):
        logger.warning("too early")


# ---- samplers and prepare_data_loader ----------------------------------------------------------
def test_seedable_sampler_draws_what_torch_random_sampler_draws_from_the_same_seed() -> None:
    data = list(range(23))
    for epoch in (0, 3):
        reference = list(RandomSampler(data, generator=torch.Generator().manual_seed(11 + epoch)))
        sampler = SeedableRandomSampler(data, generator=torch.Generator(), data_seed=11)
        sampler.set_epoch(epoch)
        assert list(sampler) == reference
        assert sampler.epoch == epoch + 1, "a full pass moves to the next epoch"
    replacement = SeedableRandomSampler(data, replacement=True, num_samples=70, seed=4)
    assert list(replacement) == list(
        RandomSampler(data, replacement=True, num_samples=70, generator=torch.Generator().manual_seed(4))
    )


def test_prepare_data_loader_with_accelerates_signature_and_a_batch_sampler_as_sampler() -> None:
    dataset = TensorDataset(torch.arange(12))
    # A dataset reading whole batches: the loader's sampler is a BatchSampler, its batch_size None.
    loader = DataLoader(dataset, sampler=BatchSampler(SequentialSampler(dataset), 4, False), batch_size=None)
    prepared = prepare_data_loader(loader, None, 2, 1, False, False)
    # Rank 1 of 2 gets the second batch of each round; the last round is completed from the start.
    assert [b[0].tolist() for b in prepared] == [[4, 5, 6, 7], [0, 1, 2, 3]]
    prepared = prepare_data_loader(DataLoader(dataset, batch_size=3), torch.device("cpu"), 1, 0, put_on_device=True)
    assert [b[0].tolist() for b in prepared] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    with pytest.raises(NotImplementedError, match="slice_fn_for_dispatch"):
        prepare_data_loader(DataLoader(dataset, batch_size=3), slice_fn_for_dispatch=lambda *a: a)


def test_the_default_shuffle_is_accelerates_random_sampler_and_is_set_by_set_seed() -> None:
    dataset = TensorDataset(torch.arange(20))
    orders = []
    for _ in range(2):
        torch.manual_seed(5)
        loader = DataLoader(dataset, batch_size=4, shuffle=True)
        expected = [i for b in DataLoader(dataset, batch_size=4, shuffle=True) for i in b[0].tolist()]
        torch.manual_seed(5)
        accelerator = Accelerator()
        got = [i for b in accelerator.prepare(loader) for i in b[0].tolist()]
        orders.append(got)
        # One process: the user's RandomSampler draws its seed from the global generator, as without accel.
        assert got == expected
        assert accelerator.rng_types == ["generator"] and not accelerator.use_seedable_sampler
    assert orders[0] == orders[1]


# ---- utils ------------------------------------------------------------------------------------
def test_find_executable_batch_size_halves_on_out_of_memory() -> None:
    tried = []

    @find_executable_batch_size(starting_batch_size=64)
    def train(batch_size: int, label: str) -> str:
        tried.append(batch_size)
        if batch_size > 20:
            raise RuntimeError("CUDA out of memory. Tried to allocate")
        return f"{label}:{batch_size}"

    expected = [64]
    while expected[-1] > 20:
        expected.append(int(expected[-1] * 0.9))
    assert train("ok") == f"ok:{expected[-1]}"
    assert tried == expected
    with pytest.raises(TypeError, match="Remove it"):
        train(32, "twice")

    @find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size: int) -> None:
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()


def test_small_utils() -> None:
    with patch_environment(accel_surface_x=1):
        assert os.environ["ACCEL_SURFACE_X"] == "1"
    assert "ACCEL_SURFACE_X" not in os.environ
    model = torch.nn.Linear(2, 2)
    assert release_memory(model, 3) == [None, None]
    assert listify({"a": torch.tensor([1.5, 2.0]), "b": (torch.tensor(3),)}) == {"a": [1.5, 2.0], "b": (3,)}
    moved = send_to_device({"x": torch.ones(1)}, torch.device("cpu"))
    assert moved["x"].device.type == "cpu"
    Accelerator()
    if importlib.util.find_spec("tqdm") is not None:
        assert list(tqdm(range(3))) == [0, 1, 2]
    else:
        with pytest.raises(ImportError, match="pip install tqdm"):
            tqdm(range(3))


def test_unsupported_names_import_and_say_why_when_used() -> None:
    from accel.utils import init_empty_weights

    with pytest.raises(NotImplementedError, match="big-model inference"):
        init_empty_weights()
    import accel.utils

    assert not hasattr(accel.utils, "no_such_name")


# ---- Accelerator members --------------------------------------------------------------------
def test_reduce_max_min_and_profile(tmp_path: Path) -> None:
    from accel.utils import ProfileKwargs

    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(output_trace_dir=str(tmp_path))])
    t = torch.tensor([1.0, -2.0])
    assert accelerator.reduce(t, "max").tolist() == [1.0, -2.0]
    with accelerator.profile() as prof:
        torch.ones(4).sum()
    assert any("aten::sum" in e.key for e in prof.key_averages())
    assert (tmp_path / "trace_rank0.json").is_file()
    assert accelerator.native_amp is False and accelerator.profile_handler is not None


SYNC = """
import torch
from accel import Accelerator
from accel.utils import synchronize_rng_states, reduce

acc = Accelerator()
torch.manual_seed(acc.process_index)
g = torch.Generator().manual_seed(100 + acc.process_index)
synchronize_rng_states(["torch", "generator"], g)
draws = torch.stack([torch.rand(()), torch.rand((), generator=g)])
spread = reduce(draws, "max") - reduce(draws, "min")
assert spread.abs().max().item() == 0.0, spread
torch.manual_seed(0)
assert torch.equal(draws[0], torch.rand(())), "rank 0's global state went everywhere"
print("synchronized", acc.process_index)
"""


def test_synchronize_rng_states_copies_rank_0s_generators(write_script) -> None:
    proc = launch(write_script(SYNC))  # fails the test if an assertion failed on either rank
    assert proc.stdout.count("synchronized") == 2, proc.stdout
