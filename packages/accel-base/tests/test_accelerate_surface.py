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
    assert (tmp_path / "profile_0.json").is_file()  # Accelerate's PROFILE_PATTERN_NAME
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


# One reduce and one pad (accel.distributed.ops) behind both entry points: only the default differs.
COLLECTIVES = """
import warnings
import torch
from accel import Accelerator
from accel.distributed import ops
from accel.utils import CannotPadNestedTensorWarning, pad_across_processes, reduce

acc = Accelerator()
rank = acc.process_index
t = torch.tensor([rank + 1.0, -(rank + 1.0)])
assert acc.reduce(t).tolist() == [3.0, -3.0], "Accelerator.reduce defaults to sum"
assert ops.reduce(t).tolist() == [3.0, -3.0]
assert reduce(t).tolist() == [1.5, -1.5], "accel.utils.reduce defaults to mean, as Accelerate's"
assert reduce(t, "max").tolist() == [2.0, -1.0] and acc.reduce(t, "min").tolist() == [1.0, -2.0]
assert acc.reduce(t, "mean", 2.0).tolist() == [3.0, -3.0] and reduce(t, "none").tolist() == t.tolist()
assert reduce({"a": [torch.tensor([rank + 1])]}, "max", 0.5)["a"][0].tolist() == [1.0]
assert t.tolist() == [rank + 1.0, -(rank + 1.0)], "the input is not modified"
for f in (acc.reduce, reduce, ops.reduce):
    try:
        f(t, "avg")
    except ValueError as exc:
        assert str(exc) == "reduction must be 'mean', 'sum', 'max', 'min' or 'none', got 'avg'.", exc
    else:
        raise AssertionError("no ValueError")
for f in (acc.pad_across_processes, pad_across_processes):
    assert f(torch.ones(1 + rank), pad_index=-1).tolist() == ([1.0, -1.0] if rank == 0 else [1.0, 1.0])
    assert f(torch.ones(2, 1 + rank), dim=1, pad_first=True).tolist() == [[0.0, 1.0] if rank == 0 else [1.0, 1.0]] * 2
    nested = torch.nested.nested_tensor([torch.ones(1 + rank)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert f(nested) is nested
    assert [w.category for w in caught if w.category is CannotPadNestedTensorWarning], caught
print("collectives", rank)
"""


def test_reduce_and_pad_share_one_implementation_with_their_own_defaults(write_script) -> None:
    proc = launch(write_script(COLLECTIVES))
    assert proc.stdout.count("collectives") == 2, proc.stdout


# ---- issue 16: Accelerate 1.15's parameters on the utils ------------------------------------
def test_send_to_device_takes_non_blocking_positionally_and_skips_keys() -> None:
    batch = {"x": torch.ones(2), "ids": torch.arange(3), "nest": [{"ids": torch.zeros(1), "y": torch.ones(1)}]}
    moved = send_to_device(batch, "meta", False, "ids")
    assert moved["x"].device.type == "meta" and moved["nest"][0]["y"].device.type == "meta"
    # skipped keys keep their very tensor, at every depth of the nest
    assert moved["ids"] is batch["ids"] and moved["nest"][0]["ids"] is batch["nest"][0]["ids"]
    moved = send_to_device(batch, torch.device("meta"), non_blocking=True, skip_keys=["ids", "x"])
    assert moved["x"] is batch["x"] and moved["nest"][0]["y"].device.type == "meta"
    assert send_to_device(tensor=torch.ones(1), device="meta").device.type == "meta"


def test_recursively_apply_passes_extra_arguments_and_can_refuse_other_leaves() -> None:
    from accel.utils import recursively_apply

    data = {"a": torch.tensor([1.0, 2.0]), "b": (torch.tensor(3.0), "text")}
    out = recursively_apply(lambda t, scale, shift=0.0: t * scale + shift, data, 10.0, shift=1.0)
    assert out["a"].tolist() == [11.0, 21.0] and out["b"][0].item() == 31.0 and out["b"][1] == "text"
    with pytest.raises(TypeError, match=r"Unsupported types \(<class 'str'>\)"):
        recursively_apply(lambda t: t, data, error_on_other_type=True)
    assert recursively_apply(len, ["ab", ["cde"]], test_type=lambda x: isinstance(x, str)) == [2, [3]]


class _Wrapper(torch.nn.Module):
    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module


def test_extract_model_from_parallel_recursive_unwraps_every_submodule() -> None:
    from accel.utils import extract_model_from_parallel

    inner = torch.nn.Linear(2, 2)
    body = torch.nn.Sequential(_Wrapper(_Wrapper(inner)), torch.nn.ReLU())
    assert extract_model_from_parallel(_Wrapper(body)) is body
    assert isinstance(body[0], _Wrapper)  # not recursive: children untouched
    out = extract_model_from_parallel(_Wrapper(body), recursive=True)
    assert out is body and body[0] is inner and isinstance(body[1], torch.nn.ReLU)


def test_get_module_children_bottom_up_with_names() -> None:
    from accel.utils import get_module_children_bottom_up

    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.ReLU()), torch.nn.Linear(1, 1))
    named = get_module_children_bottom_up(model, return_fqns=True)
    assert [n for n, _ in named] == ["0.0", "0.1", "0", "1", ""]
    assert {n: m for n, m in named} == dict(model.named_modules())
    assert get_module_children_bottom_up(model) == [m for _, m in named]


def test_torch_dynamo_plugin_disable_prepares_without_compiling() -> None:
    from accel.prepare.wrappers import is_compiled_module
    from accel.utils import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="eager", disable=True)
    assert plugin.disable and plugin.backend == "no"
    assert not is_compiled_module(Accelerator(dynamo_plugin=plugin).prepare(torch.nn.Linear(2, 2)))


def test_ao_recipe_kwargs_keeps_its_switches_for_the_adapter_or_refuses_them_with_a_config() -> None:
    from accel.utils import AORecipeKwargs

    handler = AORecipeKwargs(pad_inner_dim=False, enable_fsdp_float8_all_gather=True)
    assert (handler.config, handler.pad_inner_dim, handler.enable_fsdp_float8_all_gather) == (None, False, True)
    with pytest.raises(ValueError, match="set them on the Float8LinearConfig"):
        AORecipeKwargs(config=object(), pad_inner_dim=True)


def test_file_name_constants_name_the_files_accel_writes(tmp_path: Path) -> None:
    import accel.utils as u

    assert (u.SAFE_WEIGHTS_NAME, u.WEIGHTS_NAME, u.SAFE_WEIGHTS_INDEX_NAME) == (
        "model.safetensors",
        "pytorch_model.bin",
        "model.safetensors.index.json",
    )
    accelerator = Accelerator()
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    accelerator.save_model(model, tmp_path / "whole")
    assert (tmp_path / "whole" / u.SAFE_WEIGHTS_NAME).is_file()
    accelerator.save_model(model, tmp_path / "sharded", max_shard_size=40)
    index = tmp_path / "sharded" / u.SAFE_WEIGHTS_INDEX_NAME
    assert index.is_file()
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("*.safetensors"))
    assert shards == [u.SAFE_WEIGHTS_PATTERN_NAME.format(suffix="-00001-of-00002"), "model-00002-of-00002.safetensors"]
    accelerator.save_state(tmp_path / "ckpt")
    written = {p.name for p in (tmp_path / "ckpt").iterdir()}
    expected = {f"{u.SAFE_MODEL_NAME}.safetensors", f"{u.OPTIMIZER_NAME}.bin", f"{u.SCHEDULER_NAME}.bin"}
    assert expected <= written, written
    assert f"{u.RNG_STATE_NAME}_0.pt" in written


def test_get_gpu_info_counts_the_accelerator_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.utils import get_gpu_info

    if not torch.accelerator.is_available():
        assert get_gpu_info() == ([], 0)
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cpu"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cpu, "get_device_name", lambda i: f"fake-{i}", raising=False)
    assert get_gpu_info() == (["fake-0", "fake-1"], 2)
    monkeypatch.delattr(torch.cpu, "get_device_name")
    assert get_gpu_info() == (["cpu:0", "cpu:1"], 2)


def test_is_bnb_available_compares_min_version(monkeypatch: pytest.MonkeyPatch) -> None:
    import accel.compat.imports as imports

    monkeypatch.setattr(imports, "_bnb_installed", lambda: True)
    monkeypatch.setattr(imports.importlib.metadata, "version", lambda name: "0.40.0")
    assert imports.is_bnb_available() and imports.is_bnb_available("0.39.0")
    assert not imports.is_bnb_available(min_version="0.41.0")
    monkeypatch.setattr(imports, "_bnb_installed", lambda: False)
    assert not imports.is_bnb_available()
