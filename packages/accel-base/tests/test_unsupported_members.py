"""Accelerate members and arguments accel lacks or supports differently (issue 16, "Bad input"): an unsupported
member of `Accelerator` / the state objects raises an error that names it and says what to use (an
`AttributeError`, so `hasattr` keeps working, and an `AccelError`); the cheap ones exist with Accelerate's
meaning; `Accelerator(torch_tp_plugin=, deepspeed_plugins=)` and `load_state(load_kwargs=, **kwargs)` are honoured
or refused by name, never a bare TypeError and never silently."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from accel import Accelerator, DeepSpeedPlugin
from accel.compat.table import AccelerateFeatureError, AccelerateNameError, missing_member, reason_for
from accel.errors import AccelError
from accel.state import AcceleratorState, GradientState, PartialState


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        ("Accelerator", "deepspeed_engine_wrapped"),
        ("AcceleratorState", "megatron_lm_plugin"),
        ("AcceleratorState", "downcast_bfloat"),
        ("GradientState", "is_fakedev_gradients_synced"),
    ],
)
def test_unsupported_member_names_itself_and_says_why(owner: str, name: str) -> None:
    acc = Accelerator(cpu=True)
    obj = {"Accelerator": acc, "AcceleratorState": acc.state, "GradientState": acc.gradient_state}[owner]
    with pytest.raises(AccelerateNameError) as info:
        getattr(obj, name)
    assert isinstance(info.value, AttributeError) and isinstance(info.value, AccelError)
    message = str(info.value)
    assert message.startswith(f"`{owner}.{name}` of Accelerate is not supported by accel: ")
    reason = reason_for(name)
    if reason is not None:
        assert reason in message
    else:
        assert "adapter package" in message
    # AttributeError semantics kept: hasattr / getattr with a default do not raise.
    assert not hasattr(obj, name)
    assert getattr(obj, name, "default") == "default"


def test_other_missing_names_keep_pythons_message_with_the_right_class() -> None:
    acc = Accelerator(cpu=True)
    for obj, owner in [(acc, "Accelerator"), (acc.state, "AcceleratorState"), (PartialState(), "PartialState")]:
        with pytest.raises(AttributeError, match=rf"^'{owner}' object has no attribute 'not_a_member'$") as info:
            _ = obj.not_a_member
        assert not isinstance(info.value, AccelError)
    with pytest.raises(AttributeError, match=r"^'GradientState' object has no attribute 'not_a_member'$"):
        _ = acc.gradient_state.not_a_member
    # Before: AcceleratorState forwarded the miss to PartialState, whose message named 'PartialState'.
    with pytest.raises(AccelerateNameError, match=r"^`AcceleratorState\.megatron_lm_plugin`"):
        _ = acc.state.megatron_lm_plugin

    class MyAccelerator(Accelerator):
        pass

    AcceleratorState._reset_state(True)
    with pytest.raises(AttributeError, match=r"^'MyAccelerator' object has no attribute 'x'$"):
        _ = MyAccelerator(cpu=True).x


def test_a_failing_property_keeps_its_own_error() -> None:
    """`__getattr__` runs when a property's getter raises AttributeError: that error must come through."""
    acc = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"^`AcceleratorState` object has no attribute `mixed_precision`\. "):
        _ = acc.mixed_precision
    GradientState._reset_state()
    with pytest.raises(AttributeError, match=r"^'GradientState' object has no attribute 'plugin_kwargs'$"):
        _ = acc.gradient_state.num_steps


def test_missing_member_only_matches_accelerates_members() -> None:
    # `load_state_dict` has a big-model reason at module level; as a member of Accelerator it is just missing.
    assert type(missing_member("Accelerator", "load_state_dict")) is AttributeError
    assert isinstance(missing_member("AcceleratorState", "downcast_bfloat"), AccelerateNameError)
    assert type(missing_member("PartialState", "downcast_bfloat")) is AttributeError


def test_state_parallelism_members_mirror_the_accelerator() -> None:
    acc = Accelerator(cpu=True)
    state = acc.state
    assert state.parallelism_config is None and acc.parallelism_config is None
    assert state.device_mesh is None and acc.torch_device_mesh is None
    assert state.torch_tp_plugin is None and state.deepspeed_plugins is None
    with pytest.raises(ValueError, match=r"^DeepSpeed is not enabled, please make sure"):
        state.get_deepspeed_plugin("default")
    with pytest.raises(ValueError, match=r"^DeepSpeed is not enabled"):
        state.select_deepspeed_plugin()


class _TPPlugin:
    """Stands for Accelerate's `TorchTensorParallelPlugin` (its only field is `tp_size`)."""

    def __init__(self, tp_size: int) -> None:
        self.tp_size = tp_size


def test_torch_tp_plugin_runs_as_parallelism_config_with_accelerates_warning() -> None:
    plugin = _TPPlugin(1)
    with pytest.warns(FutureWarning, match=r"^`TorchTensorParallelPlugin` is deprecated .* `tp_size` instead\.$"):
        acc = Accelerator(cpu=True, torch_tp_plugin=plugin)
    pc = acc.parallelism_config
    assert pc is not None and pc.tp_size == 1 and pc.total_size == 1
    assert acc.state.parallelism_config is pc and acc.state.torch_tp_plugin is plugin


def test_torch_tp_plugin_larger_than_the_run_is_checked_like_parallelism_config() -> None:
    with pytest.warns(FutureWarning), pytest.raises(ValueError) as via_plugin:
        Accelerator(cpu=True, torch_tp_plugin=_TPPlugin(2))
    from accel.utils import ParallelismConfig

    AcceleratorState._reset_state(True)
    with pytest.raises(ValueError) as via_config:
        Accelerator(cpu=True, parallelism_config=ParallelismConfig(tp_size=2))
    assert type(via_plugin.value) is type(via_config.value) and str(via_plugin.value) == str(via_config.value)


def test_torch_tp_plugin_that_is_not_one_names_parallelism_config() -> None:
    with pytest.raises(AccelerateFeatureError, match=r"ParallelismConfig\(tp_size=\.\.\.\)") as info:
        Accelerator(cpu=True, torch_tp_plugin=object())
    assert isinstance(info.value, NotImplementedError)


def test_one_deepspeed_plugin_by_name_is_the_deepspeed_plugin() -> None:
    plugin = DeepSpeedPlugin(zero_stage=2)
    acc = Accelerator(cpu=True, deepspeed_plugins={"actor": plugin})
    state = acc.state
    assert state.strategy_name == "deepspeed" and acc.deepspeed_plugin is plugin and plugin.selected
    assert state.deepspeed_plugins == {"actor": plugin}
    assert state.get_deepspeed_plugin("actor") is plugin
    state.select_deepspeed_plugin("actor")
    with pytest.raises(
        KeyError, match=r"No DeepSpeed plugin named 'critic': this Accelerator has the names \['actor'\]"
    ):
        state.get_deepspeed_plugin("critic")

    AcceleratorState._reset_state(True)
    acc = Accelerator(cpu=True, deepspeed_plugin=plugin)
    assert acc.state.deepspeed_plugins is plugin  # Accelerate keeps a plugin given alone as is
    assert acc.state.get_deepspeed_plugin("default") is plugin
    with pytest.raises(KeyError, match=r"one plugin, given as deepspeed_plugin="):
        acc.state.select_deepspeed_plugin("actor")


def test_several_deepspeed_plugins_first_active_then_selected_by_name() -> None:
    from accel.utils import get_active_deepspeed_plugin

    actor, reference = DeepSpeedPlugin(zero_stage=2), DeepSpeedPlugin(zero_stage=3)
    acc = Accelerator(cpu=True, deepspeed_plugins={"actor": actor, "reference": reference})
    state = acc.state
    assert state.deepspeed_plugins == {"actor": actor, "reference": reference}
    assert acc.deepspeed_plugin is actor is state.deepspeed_plugin is get_active_deepspeed_plugin(state)
    assert actor.selected and not reference.selected
    state.select_deepspeed_plugin("reference")
    assert acc.deepspeed_plugin is reference is get_active_deepspeed_plugin(state)
    assert reference.selected and not actor.selected
    assert state.get_deepspeed_plugin("actor") is actor
    # An unknown name changes nothing.
    with pytest.raises(KeyError, match=r"\['actor', 'reference'\]"):
        state.select_deepspeed_plugin("critic")
    assert acc.deepspeed_plugin is reference and reference.selected and not actor.selected
    # Accelerate's rules: selection only through the state; `selected` is read-only.
    with pytest.raises(
        ValueError, match=r"^A `DeepSpeedPlugin` object must be enabled manually .*select_deepspeed_plugin"
    ):
        actor.select()
    with pytest.raises(NotImplementedError, match=r"^'enabled' can only be set through"):
        actor.selected = True


def test_deepspeed_plugins_bad_input_gets_accelerates_errors() -> None:
    from accel.utils import get_active_deepspeed_plugin

    with pytest.raises(TypeError, match=r"^`deepspeed_plugin` must be a DeepSpeedPlugin object\.$"):
        Accelerator(cpu=True, deepspeed_plugins={"actor": DeepSpeedPlugin(), "reference": {"zero_optimization": {}}})
    with pytest.raises(ValueError, match=r"names no DeepSpeed plugin"):
        Accelerator(cpu=True, deepspeed_plugins={})
    plugins = {"actor": DeepSpeedPlugin(zero_stage=2), "reference": DeepSpeedPlugin(zero_stage=3)}
    with pytest.raises(ValueError, match=re.escape("You cannot pass in both `deepspeed_plugins` and")):
        Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(), deepspeed_plugins=plugins)
    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"^Couldn't retrieve the active `DeepSpeedPlugin` as none were enabled"):
        get_active_deepspeed_plugin(acc.state)


def _checkpoint(tmp_path):
    torch.manual_seed(0)
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    model(torch.ones(4, 3)).sum().backward()
    opt.step()
    path = acc.save_state(tmp_path / "ckpt")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    exp_avg = opt.state_dict()["state"][0]["exp_avg"].clone()
    return acc, model, opt, path, saved, exp_avg


def test_load_state_honours_map_location_and_weights_only(tmp_path) -> None:
    acc, model, opt, path, saved, exp_avg = _checkpoint(tmp_path)
    for kwargs in (
        {"map_location": "cpu"},
        {"map_location": "on_device"},
        {"load_kwargs": {"weights_only": True}},
        {"load_kwargs": {}, "map_location": None, "strict": True},
    ):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        acc.load_state(path, **kwargs)
        for key, value in model.state_dict().items():
            assert torch.equal(value, saved[key]), kwargs
        assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], exp_avg)
    acc.load_state(path, {"weights_only": True})  # positional load_kwargs, as in Accelerate's signature


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"load_kwargs": {"weights_only": False}}, AccelError, r"weights_only': False\}\): accel never unpickles"),
        ({"load_kwargs": {"mmap": True}}, AccelError, r"load_kwargs\['mmap'\] cannot be honoured"),
        ({"load_module_strict": False}, AccelError, r"load_module_strict= cannot be honoured"),
        ({"map_location": "cuda:0"}, TypeError, r"^Unsupported optimizer map location passed"),
    ],
)
def test_load_state_refuses_what_it_cannot_honour_before_loading(tmp_path, kwargs, error, pattern) -> None:
    acc, model, _opt, path, saved, _ = _checkpoint(tmp_path)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    changed = {k: v.clone() for k, v in model.state_dict().items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(error, match=pattern) as info:
            acc.load_state(path, **kwargs)
    assert isinstance(info.value, TypeError)
    for key, value in model.state_dict().items():  # nothing was loaded
        assert torch.equal(value, changed[key]) and not torch.equal(value, saved[key])
