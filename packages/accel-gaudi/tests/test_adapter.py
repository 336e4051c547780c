"""The Gaudi adapter in one process, emulated: device, detection, placement, precision wrappers,
step markers, options and launch flags, and the quantized-model errors."""

from __future__ import annotations

import copy
import importlib
import warnings

import pytest
import torch
from accel import Accelerator, AdapterUnavailableError, ProfileKwargs, set_seed
from accel.adapter.registry import select_adapter
from accel.cli import _launch_parser, worker_env
from accel.precision.base import remove_autocast_wrapper
from accel.prepare.context import RunContext
from accel.prepare.walk import check_on_device, convert_model
from accel.strategies.base import Strategy
from accel.strategies.ddp import DDPStrategy
from accel_gaudi import GaudiAdapter, GaudiOptions, hpu_emulated
from torch import nn


def ctx(adapter: GaudiAdapter | None = None, **kw) -> RunContext:
    base = {
        "device": torch.device("meta"),
        "device_placement": True,
        "strategy": DDPStrategy(),
        "adapter": adapter or GaudiAdapter(emulate=True),
    }
    return RunContext(**{**base, **kw})


def walk(model: nn.Module, c: RunContext) -> nn.Module:
    """The core's model steps for this adapter, as `prepare` runs them before the strategy."""
    model = convert_model(model, c)
    check_on_device(model, c)
    return model


# ---- device and detection ----------------------------------------------------------------
def test_hardware_device_and_backend_and_their_emulation():
    real, emulated = GaudiAdapter(emulate=False), GaudiAdapter(emulate=True)
    assert (real.device_type, real.backend, real.device_for(3)) == ("hpu", "hccl", torch.device("hpu"))
    assert (emulated.device_type, emulated.backend, emulated.device_for(3)) == ("cpu", "gloo", torch.device("cpu"))
    assert real.ddp_device_ids(torch.device("hpu")) is None


def test_detection_goes_through_hpu_module_and_says_why():
    with pytest.raises(ImportError, match="habana_frameworks"):
        importlib.import_module("accel_gaudi.hpu")
    avail = GaudiAdapter.availability()
    assert not avail and "habana_frameworks is not installed" in avail.reason
    with pytest.raises(AdapterUnavailableError, match=r"'gaudi' is installed but cannot run here: habana_frameworks"):
        select_adapter("gaudi")
    assert select_adapter("gaudi", emulate=True) is GaudiAdapter


def test_emulation_replaces_only_the_vendor_module():
    acc = Accelerator(adapter="gaudi", emulate=True)
    assert acc.adapter.vendor is hpu_emulated
    assert acc.device == torch.device("cpu")
    # The hccl registration call is made before any process group, emulated or not.
    assert hpu_emulated.calls["init_distributed"] == 1


def test_fp16_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"'gaudi' adapter does not support mixed_precision='fp16'.*'bf16'"):
        Accelerator(adapter="gaudi", emulate=True, mixed_precision="fp16")


# ---- placement and evaluation mode ---------------------------------------------------------
def test_single_process_places_the_model():
    model = walk(nn.Linear(2, 2), ctx())
    assert model.weight.device.type == "meta"


def test_multi_process_training_places_the_model_by_default_as_current_optimum_habana():
    # optimum-habana >= 1.19 (GaudiAccelerator.prepare_model -> Accelerate's): `device_placement` True,
    # the default, moves the model in multi-HPU training too; the pre-1.19 no-move rule is gone.
    adapter = GaudiAdapter(emulate=True)
    multi = {"use_distributed": True, "num_processes": 2}
    moved = walk(nn.Linear(2, 2), ctx(adapter, **multi))
    assert {p.device.type for p in moved.parameters()} == {"meta"}
    moved = walk(nn.Linear(2, 2), ctx(adapter, strategy=Strategy(), device_placement_requested=True, **multi))
    assert {p.device.type for p in moved.parameters()} == {"meta"}


def test_device_placement_false_leaves_the_model_where_it_is():
    adapter = GaudiAdapter(emulate=True)
    multi = {"use_distributed": True, "num_processes": 2, "device_placement": False}
    kept = walk(nn.Linear(2, 2), ctx(adapter, strategy=Strategy(), **multi))
    assert {p.device.type for p in kept.parameters()} == {"cpu"}
    # Under DDP the replicas must start on the device: the core refuses the model left on the host.
    with pytest.raises(ValueError, match=r"parameters on \['cpu'\].*model.to\(accelerator.device\)"):
        walk(nn.Linear(2, 2), ctx(adapter, **multi))


def test_evaluation_mode_places_and_applies_only_precision():
    model = nn.Sequential(nn.Linear(2, 2))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    adapter = GaudiAdapter(emulate=True, options={"force_autocast": True})
    c = ctx(adapter, device=torch.device("cpu"), use_distributed=True, evaluation_mode=True, mixed_precision="bf16")
    prepared = walk(model, c)
    assert prepared is model  # no DDP wrapper (and no process group needed)
    out = prepared(torch.ones(1, 2))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    moved = walk(nn.Linear(2, 2), ctx(use_distributed=True, evaluation_mode=True))
    assert moved.weight.device.type == "meta"


# ---- force_autocast -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("policy", "mixed_precision", "force", "autocast"),
    [
        # Gaudi's rule (`native_amp and force_autocast`): only bf16 with the flag.
        ("native_amp", "bf16", True, True),
        ("native_amp", "bf16", False, False),
        ("native_amp", "no", True, False),
        ("native_amp", "no", False, False),
        # The portable policy: bf16 always, the flag whatever mixed_precision says.
        ("always", "bf16", False, True),
        ("always", "no", True, True),
        ("always", "no", False, False),
    ],
)
def test_autocast_policy_decides_when_the_forward_is_wrapped(policy, mixed_precision, force, autocast):
    options = {"autocast_policy": policy, "force_autocast": force}
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision=mixed_precision, adapter_options=options)
    model = nn.Sequential(nn.Linear(4, 4))
    seen = []
    model[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    out = acc.prepare(model)(torch.randn(2, 4))
    assert seen == [torch.bfloat16 if autocast else torch.float32] and out.dtype == torch.float32
    assert ("_original_forward" in model.__dict__) == autocast


def test_autocast_policy_is_the_seeds_by_default_and_checked(monkeypatch):
    assert GaudiAdapter(emulate=True).config.autocast_policy == "native_amp"
    monkeypatch.setenv("ACCEL_GAUDI_AUTOCAST_POLICY", "sometimes")
    with pytest.raises(ValueError, match="ACCEL_GAUDI_AUTOCAST_POLICY"):
        GaudiAdapter(emulate=True)


def test_force_autocast_wraps_forward_in_bf16_and_unwrap_restores(monkeypatch):
    monkeypatch.setenv("ACCEL_GAUDI_FORCE_AUTOCAST", "1")
    acc = Accelerator(adapter="gaudi", emulate=True, mixed_precision="bf16")
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    original = model.forward
    seen = []
    model[2].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    prepared = acc.prepare(model)
    x = torch.randn(3, 4)
    out = prepared(x)
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    assert prepared._original_forward == original
    expected = original(x)
    assert torch.allclose(out, expected, atol=5e-2) and not torch.equal(out, expected)
    acc.unwrap_model(prepared, keep_fp32_wrapper=False)
    assert prepared.forward == original and torch.equal(prepared(x), expected)
    assert seen[-1] == torch.float32


def test_without_force_autocast_mixed_precision_no_leaves_forward_alone():
    model = nn.Linear(2, 2)
    prepared = Accelerator(adapter="gaudi", emulate=True).prepare(model)
    assert "_original_forward" not in prepared.__dict__
    remove_autocast_wrapper(prepared)


# ---- step markers -------------------------------------------------------------------------
def _train(acc: Accelerator, micro_batches: int) -> list[int]:
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    after = []
    for i in range(micro_batches):
        with acc.accumulate(model):
            acc.backward(model(torch.full((2, 3), float(i))).sum())
            after.append(hpu_emulated.calls["mark_step"])
            opt.step()
            opt.zero_grad()
            after.append(hpu_emulated.calls["mark_step"])
    return after


def test_mark_step_after_backward_and_after_each_real_optimizer_step():
    acc = Accelerator(adapter="gaudi", emulate=True, gradient_accumulation_steps=2)
    # backward marks; the optimizer step marks only on the micro-batch that really steps.
    assert _train(acc, 4) == [1, 1, 2, 3, 4, 4, 5, 6]


def test_no_mark_step_outside_lazy_mode(monkeypatch):
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    acc = Accelerator(adapter="gaudi", emulate=True)
    assert _train(acc, 2) == [0, 0, 0, 0]


# ---- options and launch flags --------------------------------------------------------------
def test_launch_flags_become_options(monkeypatch):
    monkeypatch.setenv("ACCEL_ADAPTER", "gaudi")
    args = _launch_parser().parse_args(
        [
            "--emulate",
            "--distribution-strategy",
            "fast_ddp",
            "--use-regional-compilation",
            "--force-autocast",
            "--fp8",
            "train.py",
        ]
    )
    env = worker_env(args)
    assert env["ACCEL_GAUDI_DISTRIBUTION_STRATEGY"] == "fast_ddp"
    options = GaudiOptions.from_env(env)
    assert options == GaudiOptions(
        distribution_strategy="fast_ddp", use_regional_compilation=True, force_autocast=True, fp8=True
    )
    plain = worker_env(_launch_parser().parse_args(["--emulate", "train.py"]))
    assert not any(k.startswith("ACCEL_GAUDI_") for k in plain)
    assert GaudiOptions.from_env(plain) == GaudiOptions()


def test_adapter_reads_options_once_at_init(monkeypatch):
    monkeypatch.setenv("ACCEL_GAUDI_DISTRIBUTION_STRATEGY", "FAST_DDP")
    adapter = GaudiAdapter(emulate=True)
    monkeypatch.setenv("ACCEL_GAUDI_DISTRIBUTION_STRATEGY", "ddp")
    assert adapter.config.distribution_strategy == "fast_ddp"
    assert GaudiAdapter(emulate=True, options={"fp8": True}).config.fp8


def test_bad_options_are_refused_clearly(monkeypatch):
    with pytest.raises(ValueError, match=r"one of \('ddp', 'fast_ddp'\), got 'zero'"):
        GaudiOptions.from_env({"ACCEL_GAUDI_DISTRIBUTION_STRATEGY": "zero"})
    with pytest.raises(ValueError, match=r"ACCEL_GAUDI_FP8='maybe' is not a boolean; set it to 1 or 0"):
        GaudiOptions.from_env({"ACCEL_GAUDI_FP8": "maybe"})
    with pytest.raises(ValueError, match=r"Unknown Gaudi adapter option\(s\) \['fp9'\]"):
        GaudiOptions.from_env({}, overrides={"fp9": True})
    with pytest.raises(SystemExit):
        _launch_parser().parse_args(["--distribution-strategy", "zero", "train.py"])


# ---- quantized models with a device map ------------------------------------------------------
def _quantized(device_map: dict) -> nn.Module:
    model = nn.Linear(2, 2)
    model.is_loaded_in_8bit = True
    model.hf_device_map = device_map
    return model


def test_quantized_model_errors_with_the_gaudi_adapter():
    acc = Accelerator(adapter="gaudi", emulate=True)
    with pytest.raises(ValueError, match=r"different device than the one you're training on \(cpu\)"):
        acc.prepare(_quantized({"": 1}))
    with pytest.raises(ValueError, match="different device"):
        acc.prepare(_quantized({"": "hpu:0"}))
    with pytest.raises(ValueError, match="with CPU or disk offload"):
        acc.prepare(_quantized({"a": "cpu", "b": "disk"}))
    ok = _quantized({"": 0})
    assert acc.prepare(ok) is ok


def test_options_from_code_choose_fast_ddp_and_win_over_the_environment(monkeypatch):
    from accel import Accelerator

    monkeypatch.setenv("ACCEL_GAUDI_DISTRIBUTION_STRATEGY", "ddp")
    acc = Accelerator(
        adapter="gaudi", emulate=True, adapter_options={"distribution_strategy": "fast_ddp", "force_autocast": True}
    )
    assert acc.adapter.config.distribution_strategy == "fast_ddp" and acc.adapter.config.force_autocast
    assert acc.strategy.name == "fast_ddp"


def test_unknown_options_from_code_are_refused():
    from accel import Accelerator

    with pytest.raises(ValueError, match=r"Unknown Gaudi adapter option\(s\) \['fastest'\]; the options are \["):
        Accelerator(adapter="gaudi", emulate=True, adapter_options={"fastest": True})


# ---- profiler, random state ------------------------------------------------------------------
def test_profile_records_the_hpu_next_to_the_cpu_and_takes_accelerates_hpu_activity(tmp_path):
    cpu, hpu = torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.HPU
    acc = Accelerator(adapter="gaudi", emulate=True)
    handler = ProfileKwargs(activities=["cpu", "hpu"], output_trace_dir=str(tmp_path))  # Accelerate's names
    with warnings.catch_warnings():  # without Habana's stack torch says it cannot profile the HPU: not the point here
        warnings.simplefilter("ignore")
        with acc.profile() as prof:  # no activities: the CPU and the adapter's device, as torch's default on HPU
            torch.ones(2).add(1)
        assert prof.activities == {cpu, hpu}
        with acc.profile(handler) as prof:
            torch.ones(2).add(1)
    assert prof.activities == {cpu, hpu} and (tmp_path / "profile_0.json").is_file()


def _hpu_draw() -> torch.Tensor:
    return torch.rand(4, generator=hpu_emulated.generator())


def test_set_seed_seeds_the_hpu_and_checkpoints_carry_its_generator(tmp_path):
    acc = Accelerator(adapter="gaudi", emulate=True)
    set_seed(7)
    first = _hpu_draw()
    set_seed(8)
    assert not torch.equal(_hpu_draw(), first)
    set_seed(7)
    assert torch.equal(_hpu_draw(), first)  # seeding reaches the HPU generator (torch.hpu.random.manual_seed_all)
    assert hpu_emulated.calls["manual_seed"] == 3

    acc.save_state(tmp_path / "ckpt")
    at_save = hpu_emulated.generator().get_state()
    expected = _hpu_draw()
    _hpu_draw()  # move the generator on
    acc.load_state(tmp_path / "ckpt")
    assert torch.equal(_hpu_draw(), expected)
    saved = torch.load(tmp_path / "ckpt" / "random_states_0.pt", weights_only=True)["device"]
    assert len(saved) == 1 and torch.equal(saved[0], at_save)  # one HPU per process: its generator's state


# ---- HPU graphs for training ---------------------------------------------------------------------
def test_use_hpu_graphs_for_training_wraps_the_model_in_the_module_cacher_once():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
    reference = copy.deepcopy(model)
    acc = Accelerator(adapter="gaudi", emulate=True, adapter_options={"use_hpu_graphs_for_training": True})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prepared, opt = acc.prepare(model, opt)
    assert prepared is model and hpu_emulated.calls["module_cacher"] == 1
    x = torch.randn(5, 3)
    out = prepared(x)
    assert hpu_emulated.calls["hpu_graph_forward"] == 1 and torch.equal(out, reference(x))
    acc.backward(out.sum())
    opt.step()
    assert not torch.equal(prepared[0].weight, reference[0].weight)  # it trains through the cacher
    acc.prepare_model(model)  # already cached: not wrapped again
    assert hpu_emulated.calls["module_cacher"] == 1


@pytest.mark.parametrize("case", ["option_off", "evaluation_mode"])
def test_no_module_cacher_without_the_option_or_for_evaluation(case):
    options = {"use_hpu_graphs_for_training": case == "evaluation_mode"}
    acc = Accelerator(adapter="gaudi", emulate=True, adapter_options=options)
    model = acc.prepare_model(nn.Linear(2, 2), evaluation_mode=case == "evaluation_mode")
    model(torch.ones(1, 2))
    assert hpu_emulated.calls["module_cacher"] == 0 and hpu_emulated.calls["hpu_graph_forward"] == 0


def test_context_parallel_size_needs_processes_and_the_ddp_strategies():
    """optimum-habana's `context_parallel_size` builds its groups in a multi-process run only: one process is
    refused by name (never accepted and ignored); `accelerator.mpu` is optimum-habana's parallel_state API."""
    import pytest
    from accel import Accelerator
    from accel.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(ValueError, match=r"context_parallel_size=2 splits each sequence .* has no process group"):
        Accelerator(adapter="gaudi", emulate=True, adapter_options={"context_parallel_size": 2})
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = Accelerator(adapter="gaudi", emulate=True)
    assert acc.mpu.is_unitialized() and not acc.mpu.sequence_parallel_is_initialized()
    assert acc.mpu.get_sequence_parallel_world_size() == 1 and acc.mpu.get_tensor_model_parallel_world_size() == 1
    with pytest.raises(RuntimeError, match=r"accelerator\.mpu has no groups: set context_parallel_size"):
        acc.mpu.get_data_parallel_group()
    AcceleratorState._reset_state(reset_partial_state=True)
