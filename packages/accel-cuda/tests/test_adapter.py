"""The CUDA adapter in one process: selection, device, RNG in checkpoints, free_memory, TF32,
data loaders, the fp16 scaler with an injected inf, bf16, and the device-map errors.

Tests taking `emulate` run twice: emulated on the CPU, and on a real GPU (skipped with the
reason when none is present).
"""

from __future__ import annotations

import warnings

import pytest
import torch
from accel import Accelerator, GradScalerKwargs, ProfileKwargs, set_seed
from accel.adapter.base import Adapter
from accel.adapter.registry import select_adapter
from accel.commands.launch import launch_parser, worker_env
from accel.commands.launch_resolve import resolve
from accel_cuda import CUDAAdapter, TF32Kwargs, cuda_emulated
from accel_cuda.adapter import P2P_IB_VARIABLES
from conftest import requires_gpu
from torch.testing import assert_close
from torch.utils.data import DataLoader, TensorDataset

LR = 0.1


@pytest.fixture(params=[True, pytest.param(False, marks=requires_gpu)], ids=["emulated", "gpu"])
def emulate(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def make_data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)


def flat(tensors: object) -> torch.Tensor:
    return torch.cat([t.detach().float().cpu().flatten() for t in tensors])  # type: ignore[attr-defined]


# ---- selection and device ------------------------------------------------------------------
def test_registered_under_accel_adapters_and_chosen_by_name() -> None:
    cls = select_adapter("cuda", emulate=True)
    assert cls is CUDAAdapter and issubclass(cls, Adapter)
    assert CUDAAdapter.priority > 60  # above the Gaudi adapter: CUDA machines pick CUDA first


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given on a machine without a GPU")
def test_unavailable_without_a_gpu_says_why() -> None:
    why = CUDAAdapter.availability()
    assert not why
    assert "CPU-only build" in why.reason or "sees no GPU" in why.reason


def test_emulated_device_backend_and_set_device_before_the_group() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    assert acc.device == torch.device("cpu")
    assert acc.state.backend == "gloo"
    assert cuda_emulated.current_device == [0]  # local rank 0's GPU made current
    assert "cuda (emulated on cpu)" in repr(acc)


@requires_gpu
def test_real_device_is_cuda_local_rank_with_nccl() -> None:
    acc = Accelerator(adapter="cuda")
    assert acc.device == torch.device("cuda", 0)
    assert acc.state.backend == "nccl"
    assert torch.cuda.current_device() == 0
    assert CUDAAdapter.availability()


def test_visible_devices_bound_the_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    adapter = CUDAAdapter(emulate=True)
    assert adapter.device_for(1) == torch.device("cpu") and adapter.local_index == 1
    with pytest.raises(ValueError, match=r"Local rank 2 needs GPU 2, but this process sees 2 GPU\(s\) "):
        adapter.device_for(2)
    with pytest.raises(ValueError, match=r"CUDA_VISIBLE_DEVICES=3,5\)\. Launch at most 2 process"):
        adapter.device_for(2)


def _worker_env(tmp_path, *flags: str) -> dict[str, str]:
    """What `accel launch --adapter cuda --emulate FLAGS` gives its workers (resolved here, nothing started)."""
    script = tmp_path / "train.py"
    script.write_text("")
    argv = ["--adapter", "cuda", "--emulate", *flags, str(script)]
    parser = launch_parser(argv)
    args = resolve(parser.parse_args(argv), parser)
    return {**worker_env(args), "processes": str(args.num_processes)}


def test_gpu_ids_become_cuda_visible_devices_and_count_the_processes(tmp_path) -> None:
    env = _worker_env(tmp_path, "--gpu_ids", "3, 5")
    assert (env["CUDA_VISIBLE_DEVICES"], env["processes"]) == ("3,5", "2")
    env = _worker_env(tmp_path, "--gpu_ids", "all")  # Accelerate's "all": no restriction
    assert "CUDA_VISIBLE_DEVICES" not in env and env["processes"] == "1"


RTX_4090 = "NVIDIA GeForce RTX 4090"


@pytest.mark.parametrize(
    ("gpus", "driver", "checked"),
    [
        ([RTX_4090] * 2, "535.104.05", True),
        ([RTX_4090] * 2, "550.40.07", False),  # the driver that fixed P2P/IB on them
        ([RTX_4090], "535.104.05", False),  # one GPU: nothing goes over P2P
        (["NVIDIA H100 80GB HBM3"] * 2, "535.104.05", False),
    ],
)
def test_rtx_4000_gpus_need_p2p_and_ib_off_and_accel_launch_turns_them_off(
    gpus: list[str], driver: str, checked: bool, monkeypatch: pytest.MonkeyPatch, tmp_path, capsys
) -> None:
    for var in P2P_IB_VARIABLES:
        monkeypatch.delenv(var, raising=False)
    cuda_emulated.machine.update(gpus=gpus, driver=driver)
    env = _worker_env(tmp_path)
    assert [env.get(var) for var in P2P_IB_VARIABLES] == (["1", "1"] if checked else [None, None])
    assert ("Ensuring P2P and IB communications are disabled" in capsys.readouterr().err) is checked
    adapter = CUDAAdapter(emulate=True)
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")  # one of the two is not enough
    if checked:
        with pytest.raises(
            NotImplementedError, match=r'^Using RTX 4000 series .* `NCCL_IB_DISABLE="1"` or use `accel launch`'
        ):
            adapter.before_process_group(torch.device("cpu"))
    else:
        adapter.before_process_group(torch.device("cpu"))
    monkeypatch.setenv("NCCL_IB_DISABLE", "0")  # set, whatever its value, as Accelerate checks
    adapter.before_process_group(torch.device("cpu"))
    assert _worker_env(tmp_path).get("NCCL_IB_DISABLE") is None  # the user's own setting is kept


def test_profile_records_the_gpu_next_to_the_cpu_unless_told_otherwise(tmp_path) -> None:
    cpu, gpu = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA
    acc = Accelerator(adapter="cuda", emulate=True)
    with warnings.catch_warnings():  # without a GPU torch says it cannot profile CUDA: not this test's concern
        warnings.simplefilter("ignore")
        with acc.profile() as prof:
            torch.ones(2).add(1)
    assert prof.activities == {cpu, gpu}
    handler = ProfileKwargs(activities=["cpu"], output_trace_dir=str(tmp_path))
    with acc.profile(handler) as prof:
        torch.ones(2).add(1)
    assert prof.activities == {cpu} and (tmp_path / "profile_0.json").is_file()


def test_the_machines_gpus_and_driver_come_from_nvidia_smi(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    from accel_cuda import cuda

    smi = tmp_path / "nvidia-smi"  # what nvidia-smi prints for --query-gpu=name,driver_version --format=csv,noheader
    smi.write_text(f"#!/bin/sh\necho '{RTX_4090}, 535.104.05'\necho '{RTX_4090}, 535.104.05'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cuda.machine_gpus() == ([RTX_4090, RTX_4090], "535.104.05")
    smi.unlink()  # no nvidia-smi: nothing known, nothing checked (as Accelerate)
    assert cuda.machine_gpus() == ([], "")


# ---- random state, memory, TF32 ------------------------------------------------------------
def _gpu_draw(acc: Accelerator) -> torch.Tensor:
    if acc.device.type == "cuda":
        return torch.rand(4, device=acc.device).cpu()
    return torch.rand(4, generator=cuda_emulated.generator(0))


def test_set_seed_and_checkpoints_carry_the_gpu_generators(emulate: bool, tmp_path) -> None:
    acc = Accelerator(adapter="cuda", emulate=emulate)
    set_seed(7)
    first = _gpu_draw(acc)
    set_seed(7)
    assert torch.equal(_gpu_draw(acc), first)  # seeding reaches the device generator

    acc.save_state(tmp_path / "ckpt")
    expected = _gpu_draw(acc)
    _gpu_draw(acc)  # move the generator on
    acc.load_state(tmp_path / "ckpt")
    assert torch.equal(_gpu_draw(acc), expected)
    saved = torch.load(tmp_path / "ckpt" / "random_states_0.pt", weights_only=True)["device"]
    assert isinstance(saved, list) and all(s.dtype == torch.uint8 for s in saved)


def test_free_memory_empties_the_cache() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    model = acc.prepare(build_model())
    assert acc.free_memory(model) == [None]
    assert cuda_emulated.calls["empty_cache"] == 1


def test_tf32_is_left_at_pytorch_defaults_unless_asked() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    acc.prepare(build_model())
    assert cuda_emulated.calls["set_tf32"] == 0 and cuda_emulated.tf32_state() == (False, True)
    acc = Accelerator(adapter="cuda", emulate=True, kwargs_handlers=[TF32Kwargs(matmul=True, cudnn=False)])
    acc.prepare(build_model())
    assert cuda_emulated.tf32_state() == (True, False)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"dynamo_backend": "inductor"}, (True, True)),  # compiled fp32: TF32 matmuls, cuDNN untouched
        ({"dynamo_backend": "inductor", "mixed_precision": "bf16"}, (False, True)),  # Accelerate leaves it
        ({"dynamo_backend": "no"}, (False, True)),  # not compiled: PyTorch's defaults
        ({"dynamo_backend": "inductor", "kwargs_handlers": [TF32Kwargs(matmul=False, cudnn=False)]}, (False, False)),
    ],
    ids=["compiled-fp32", "compiled-bf16", "eager-fp32", "handler-wins"],
)
def test_compiled_fp32_runs_turn_tf32_matmuls_on_as_accelerate_does(settings: dict, expected: tuple) -> None:
    acc = Accelerator(adapter="cuda", emulate=True, **settings)
    acc.prepare(build_model())  # torch.compile wraps lazily: nothing compiles here
    assert cuda_emulated.tf32_state() == expected


@requires_gpu
def test_tf32_handler_switches_the_real_backends() -> None:
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        acc = Accelerator(adapter="cuda", kwargs_handlers=[TF32Kwargs()])
        acc.prepare(build_model())
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


# ---- data loaders ----------------------------------------------------------------------------
def _loader() -> DataLoader:  # type: ignore[type-arg]
    x, y = make_data(16)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def test_emulated_loaders_do_not_pin() -> None:
    # Pinning needs a GPU runtime: the stand-in says it cannot, so loaders stay unpinned and blocking.
    acc = Accelerator(adapter="cuda", emulate=True)
    loader = acc.prepare(_loader())
    assert loader.pin_memory is False and loader.non_blocking is False
    assert len(list(loader)) == 4


def test_loaders_pin_and_copy_asynchronously_when_the_runtime_can(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_emulated, "can_pin_memory", lambda: True)
    acc = Accelerator(adapter="cuda", emulate=True)
    loader = acc.prepare(_loader())
    assert loader.pin_memory is True and loader.non_blocking is True


def test_loader_options_turn_pinning_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_emulated, "can_pin_memory", lambda: True)
    monkeypatch.setenv("ACCEL_CUDA_PIN_MEMORY", "0")
    acc = Accelerator(adapter="cuda", emulate=True)
    loader = acc.prepare(_loader())
    assert loader.pin_memory is False and loader.non_blocking is False
    monkeypatch.setenv("ACCEL_CUDA_PIN_MEMORY", "maybe")
    with pytest.raises(ValueError, match="ACCEL_CUDA_PIN_MEMORY='maybe' is not a boolean"):
        CUDAAdapter(emulate=True)


@requires_gpu
def test_real_loaders_pin_and_deliver_on_the_gpu() -> None:
    acc = Accelerator(adapter="cuda")
    loader = acc.prepare(_loader())
    assert loader.pin_memory is True and loader.non_blocking is True
    x, _ = next(iter(loader))
    assert x.device == acc.device


# ---- precision --------------------------------------------------------------------------------
def test_fp16_scaler_is_torch_amp_on_the_adapter_device_and_skips_overflow(emulate: bool) -> None:
    acc = Accelerator(
        adapter="cuda", emulate=emulate, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0)]
    )
    assert isinstance(acc.scaler, torch.amp.GradScaler)
    assert acc.scaler._device == ("cpu" if emulate else "cuda")
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    model, opt, sched = acc.prepare(model, opt, sched)
    x, y = (t.to(acc.device) for t in make_data())

    acc.backward(torch.nn.functional.mse_loss(model(x), y))
    model[0].weight.grad[0, 0] = float("inf")  # the injected overflow
    before = flat(model.parameters()).clone()
    opt.step()
    sched.step()
    opt.zero_grad()
    assert acc.optimizer_step_was_skipped is True
    assert torch.equal(flat(model.parameters()), before)
    assert sched.get_last_lr() == [LR]  # the scheduler stayed in step with the optimizer
    assert acc.scaler.get_scale() == 512.0

    ref = build_model().to(acc.device)
    with torch.autocast(acc.device.type, dtype=torch.float16):
        torch.nn.functional.mse_loss(ref(x).float(), y).backward()
    expected = before - LR * flat(p.grad for p in ref.parameters())
    acc.backward(torch.nn.functional.mse_loss(model(x), y))
    opt.step()
    sched.step()
    assert acc.optimizer_step_was_skipped is False and sched.get_last_lr() == [LR * 0.5]
    assert_close(flat(model.parameters()), expected, rtol=1e-4, atol=1e-6)


def test_bf16_runs_the_forward_under_autocast_and_returns_fp32(emulate: bool) -> None:
    acc = Accelerator(adapter="cuda", emulate=emulate, mixed_precision="bf16")
    assert acc.scaler is None
    model = acc.prepare(build_model())
    x, _ = make_data()
    x = x.to(acc.device)
    out = model(x)
    assert out.dtype == torch.float32
    ref = build_model().to(acc.device)
    with torch.autocast(acc.device.type, dtype=torch.bfloat16):
        expected = ref(x)
    assert expected.dtype == torch.bfloat16
    assert torch.equal(out, expected.float())
    assert not torch.equal(out, ref(x))  # bf16 rounding really happened


# ---- models loaded with a device map ------------------------------------------------------------
def test_quantized_model_on_another_gpu_is_refused() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    model = build_model()
    model.is_loaded_in_8bit = True
    model.hf_device_map = {"": "cuda:1"}
    with pytest.raises(ValueError, match=r"8-bit or 4-bit precision on a different device than the one you're"):
        acc.prepare(model)


def test_quantized_model_with_cpu_offload_is_refused() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    model = build_model()
    model.is_loaded_in_4bit = True
    model.hf_device_map = {"0": 0, "2": "cpu"}
    with pytest.raises(ValueError, match="8-bit or 4-bit precision with CPU or disk offload"):
        acc.prepare(model)


def test_device_map_model_is_not_moved_in_one_process() -> None:
    acc = Accelerator(adapter="cuda", emulate=True)
    model = build_model()
    model.hf_device_map = {"0": 0, "2": 1}
    assert acc.prepare(model) is model  # spread over devices by its loader: left where it is
