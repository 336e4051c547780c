"""Bad arguments get a clear error (or warning) where they are given, not silent surprises later.

Issue 14, items 2 and 9: `total_limit` of 0 or less deleted the checkpoint just written;
`gradient_accumulation_steps=2.5` became 2; a bad `ACCEL_GRADIENT_ACCUMULATION_STEPS` failed
without naming the variable; a non-handler in `kwargs_handlers` was ignored; a zero timeout
became 30 minutes; an optimizer over no prepared model's parameters trained nothing silently.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from accel import Accelerator, GradientAccumulationPlugin, InitProcessGroupKwargs, ProjectConfiguration
from accel.checkpoint.state import list_checkpoints
from accel.errors import PrepareError


# ---- item 2: total_limit ------------------------------------------------------------------------------
@pytest.mark.parametrize("limit", [0, -1, -5, 1.5, True, "3"])
def test_total_limit_must_be_none_or_at_least_one(limit: object) -> None:
    with pytest.raises(ValueError, match=r"`ProjectConfiguration.total_limit` must be None or an int >= 1"):
        ProjectConfiguration(project_dir="p", automatic_checkpoint_naming=True, total_limit=limit)  # type: ignore[arg-type]


def test_total_limit_is_checked_on_assignment_too() -> None:
    config = ProjectConfiguration(total_limit=2)
    with pytest.raises(ValueError, match="would delete the checkpoint just written"):
        config.total_limit = 0
    assert config.total_limit == 2
    config.total_limit = None
    assert config.total_limit is None


@pytest.mark.parametrize("limit", [0, 1, 2])
def test_save_never_deletes_the_checkpoint_just_written(tmp_path: Path, limit: int) -> None:
    # Before the fix, total_limit=0 was accepted and save_state() returned a path it had just pruned.
    def make() -> Accelerator:
        config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=limit)
        return Accelerator(cpu=True, project_config=config)

    if limit < 1:
        with pytest.raises(ValueError, match="total_limit"):
            make()
        return
    accelerator = make()
    accelerator.prepare(torch.nn.Linear(2, 2))
    for n in range(3):
        path = Path(accelerator.save_state())
        assert path.is_dir() and path.name == f"checkpoint_{n}"
        kept = [p.name for _, p in list_checkpoints(tmp_path)]
        assert kept == [f"checkpoint_{i}" for i in range(max(0, n + 1 - limit), n + 1)]


# ---- item 9: gradient accumulation steps ----------------------------------------------------------------
@pytest.mark.parametrize("steps", [2.5, "2", True, 0, -1])
def test_gradient_accumulation_steps_must_be_a_positive_int(steps: object) -> None:
    with pytest.raises(ValueError, match=r"`gradient_accumulation_steps` must be an int >= 1, got "):
        Accelerator(cpu=True, gradient_accumulation_steps=steps)  # type: ignore[arg-type]


def test_a_whole_float_is_taken_as_accelerate_takes_it() -> None:
    assert Accelerator(cpu=True, gradient_accumulation_steps=2.0).gradient_accumulation_steps == 2  # type: ignore[arg-type]


def test_plugin_num_steps_must_be_a_positive_int() -> None:
    with pytest.raises(ValueError, match=r"`GradientAccumulationPlugin.num_steps` must be an int >= 1, got 2.5"):
        GradientAccumulationPlugin(num_steps=2.5)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["abc", "2.5", "0", "-3"])
def test_bad_accumulation_env_names_the_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", value)
    with pytest.raises(ValueError, match=rf"ACCEL_GRADIENT_ACCUMULATION_STEPS={value!r} is not an int >= 1"):
        Accelerator(cpu=True)


def test_a_bad_accelerate_variable_is_named_as_the_user_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "abc")  # what `accelerate launch` sets
    # accel maps it onto ACCEL_GRADIENT_ACCUMULATION_STEPS in os.environ: recorded here so it is removed after.
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "")
    monkeypatch.delenv("ACCEL_GRADIENT_ACCUMULATION_STEPS")
    with pytest.raises(ValueError, match=r"^ACCELERATE_GRADIENT_ACCUMULATION_STEPS='abc' is not an int >= 1"):
        Accelerator(cpu=True)


def test_accumulation_env_still_sets_the_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "3")
    assert Accelerator(cpu=True, gradient_accumulation_steps=2).gradient_accumulation_steps == 3


def test_empty_accumulation_env_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_GRADIENT_ACCUMULATION_STEPS", "")
    assert Accelerator(cpu=True, gradient_accumulation_steps=2).gradient_accumulation_steps == 2


# ---- item 9: kwargs handlers ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("handler", "hint"),
    [({"timeout": 10}, ""), (object(), ""), (ProjectConfiguration(), "project_config=")],
    ids=["dict", "object", "ProjectConfiguration"],
)
def test_non_handler_in_kwargs_handlers_is_refused(handler: object, hint: str) -> None:
    with pytest.raises(TypeError, match=r"Unsupported kwargs handler passed: .*must be one that inherits") as info:
        Accelerator(cpu=True, kwargs_handlers=[handler])  # type: ignore[list-item]
    assert hint in str(info.value)
    assert isinstance(info.value, AssertionError)  # what Accelerate raises there


@pytest.mark.parametrize("timeout", [timedelta(0), timedelta(seconds=-1)])
def test_init_timeout_must_be_positive(timeout: timedelta) -> None:
    with pytest.raises(ValueError, match=r"InitProcessGroupKwargs\(timeout=.*\) must be positive"):
        InitProcessGroupKwargs(timeout=timeout)


def test_init_timeout_must_be_a_timedelta() -> None:
    with pytest.raises(TypeError, match=r"must be a datetime.timedelta, got 600"):
        InitProcessGroupKwargs(timeout=600)  # type: ignore[arg-type]


def test_init_timeout_given_is_used() -> None:
    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=timedelta(seconds=42))])
    assert accelerator.state.timeout == timedelta(seconds=42)


# ---- item 9 (issue 14), an error since issue 26: an optimizer over no prepared model's parameters ----------
DETACHED = (
    "The SGD optimizer passed to `prepare` holds 2 parameter tensor(s), none of which belongs to a model prepared by "
    "this Accelerator, so stepping it would train none of them. Build the optimizer from the model's own parameters "
    "(`optimizer = torch.optim.AdamW(model.parameters())`) and pass both to the same `prepare` call. If it is meant "
    "to train tensors outside every model, set ACCEL_ALLOW_DETACHED_OPTIMIZERS=1."
)


def _refusals(accelerator: Accelerator, *objects: object) -> list[str]:
    """The detached-optimizer error `prepare` raises for `objects` ([] when it prepares them)."""
    try:
        accelerator.prepare(*objects)
    except PrepareError as exc:
        return [str(exc)]
    return []


def test_optimizer_over_another_models_parameters_is_refused() -> None:
    accelerator = Accelerator(cpu=True)
    model, stray = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert _refusals(accelerator, model, torch.optim.SGD(stray.parameters(), lr=0.1)) == [DETACHED]


def test_optimizer_prepared_after_a_different_model_is_refused() -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    assert _refusals(accelerator, torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)) == [DETACHED]


def test_detached_optimizer_allowed_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCEL_ALLOW_DETACHED_OPTIMIZERS", "1")
    accelerator = Accelerator(cpu=True)
    extra = torch.nn.Parameter(torch.zeros(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # allowed means quiet
        _, opt = accelerator.prepare(torch.nn.Linear(2, 2), torch.optim.SGD([extra], lr=0.5))
    extra.grad = torch.ones(2)
    opt.step()
    assert extra.tolist() == [-0.5, -0.5]  # it trains the tensor it was given


@pytest.mark.parametrize("case", ["together", "model_first", "partial", "no_model"])
def test_optimizer_sharing_parameters_is_accepted(case: str) -> None:
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    if case == "together":
        objects: tuple[object, ...] = (model, torch.optim.SGD(model.parameters(), lr=0.1))
    elif case == "model_first":
        model = accelerator.prepare(model)
        objects = (torch.optim.SGD(model.parameters(), lr=0.1),)
    elif case == "partial":
        extra = torch.nn.Parameter(torch.zeros(2))
        objects = (model, torch.optim.SGD([model.weight, extra], lr=0.1))
    else:  # no model prepared in this Accelerator: nothing to compare with
        objects = (torch.optim.SGD(model.parameters(), lr=0.1),)
    assert _refusals(accelerator, *objects) == []


def test_an_optimizer_paired_with_its_model_is_accepted_when_the_adapter_swaps_the_models_tensors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A vendor that optimizes a model with its optimizer may keep the optimizer's tensors (as fp32
    masters) and give the model new ones (a low-precision, re-laid-out copy), re-pointing nothing:
    the optimizer still trains that model, so the check must not say it trains nothing."""
    from accel.adapter.cpu import CPUAdapter

    def swap_the_models_tensors(self: CPUAdapter, model: torch.nn.Module, ctx: object) -> torch.nn.Module:
        for module in model.modules():
            for name, param in list(module._parameters.items()):
                if param is not None:
                    module._parameters[name] = torch.nn.Parameter(param.detach().clone())
        return model

    monkeypatch.setattr(CPUAdapter, "optimize_model", swap_the_models_tensors)
    monkeypatch.setattr(CPUAdapter, "repoints_paired_optimizers", True)
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert _refusals(accelerator, model, optimizer) == []
    # Not vacuous: the model's tensors are new and the optimizer still holds the old ones ...
    assert not {id(p) for p in model.parameters()} & {id(p) for g in optimizer.param_groups for p in g["params"]}
    # ... and a stray optimizer in the same call is still refused.
    other = torch.nn.Linear(2, 2)
    stray = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert _refusals(Accelerator(cpu=True), other, torch.optim.SGD(other.parameters(), lr=0.1), stray) == [DETACHED]


def test_save_state_keyword_arguments_without_a_model_save_function_are_named(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(torch.nn.Linear(2, 2))
    with pytest.warns(UserWarning, match=r"save_state ignores \['exclude_frozen_parameters'\]: the 'ddp' strategy"):
        path = accelerator.save_state(tmp_path / "ckpt", exclude_frozen_parameters=True)
    assert Path(path).is_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accelerator.save_state(tmp_path / "again")  # no keyword arguments: nothing to say
