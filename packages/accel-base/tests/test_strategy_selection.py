"""Which strategy runs: the user's, else the adapter's default; one the adapter does not claim is refused."""

from __future__ import annotations

import pytest
import torch
from accel import Accelerator
from accel.adapter.options import AdapterOptionsError
from accel.errors import AccelError, AdapterNotFoundError, StrategyNotFoundError, StrategyNotSupportedError


def test_a_strategy_the_adapter_does_not_claim_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_TEST_FAKEDEV", "1")
    with pytest.raises(
        StrategyNotSupportedError,
        match=r"The 'fakedev' adapter does not support the 'fsdp2' strategy; it supports \['ddp'\]\. Pick one",
    ) as info:
        Accelerator(adapter="fakedev", emulate=True, strategy="fsdp2")
    assert isinstance(info.value, AccelError) and isinstance(info.value, ValueError)


def test_the_adapter_names_the_default_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    from accel.adapter.cpu import CPUAdapter

    monkeypatch.setattr(CPUAdapter, "default_strategy", lambda self: "fsdp2")
    assert Accelerator().strategy.name == "fsdp2"
    monkeypatch.setenv("ACCEL_STRATEGY", "ddp")
    from accel.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    assert Accelerator().strategy.name == "ddp"  # the user's choice wins


def test_options_for_an_adapter_without_options_are_refused() -> None:
    with pytest.raises(
        AdapterOptionsError, match=r"The 'cpu' adapter takes no options; got adapter_options=\{'fp8': True\}"
    ):
        Accelerator(adapter_options={"fp8": True})


def test_a_missing_strategy_has_its_own_error_not_the_adapters() -> None:
    with pytest.raises(StrategyNotFoundError, match=r"No accel strategy named 'nope'\. Installed strategies: ") as info:
        Accelerator(strategy="nope")
    assert isinstance(info.value, AccelError) and isinstance(info.value, ValueError)
    assert not isinstance(info.value, AdapterNotFoundError)


def test_deepspeed_missing_from_a_script_names_the_pip_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def without_deepspeed(name, *args, **kwargs):  # as on a machine without DeepSpeed
        if name == "deepspeed" or name.startswith("deepspeed."):
            raise ModuleNotFoundError(f"No module named {name!r}", name="deepspeed")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_deepspeed)
    from accel.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(hf_ds_config={"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1}})
    accelerator = Accelerator(deepspeed_plugin=plugin)
    model = torch.nn.Linear(2, 1)
    with pytest.raises(
        ModuleNotFoundError, match=r"DeepSpeed is not installed => run `pip install 'accel-base\[deepspeed\]'`"
    ):
        accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
