"""DeepSpeedPlugin and the config resolution: "auto" filled from the Accelerator, conflicts refused
naming both places, and the prepare rules (one process; no engine is built)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from accel import Accelerator, DistributedType
from accel.adapter.registry import get_strategy_class
from accel.strategies.deepspeed.config import (
    HIDDEN_SIZE_KEYS,
    AcceleratorValues,
    DeepSpeedConfigError,
    DeepSpeedPlugin,
    DummyOptim,
    DummyScheduler,
    model_hidden_size,
    resolve_config,
)
from accel.strategies.deepspeed.strategy import DEVICE_PLACEMENT, MULTIPLE_MODELS, DeepSpeedStrategy


def values(**overrides):
    base = {
        "micro_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "num_processes": 2,
        "mixed_precision": "no",
        "has_client_optimizer": True,
    }
    return AcceleratorValues(**{**base, **overrides})


def with_zero(user: dict) -> dict:
    """`user` with a ZeRO section (`{}` unless it has one): Accelerate, and accel, refuse a config without."""
    return {"zero_optimization": {}, **user}


def test_registered_in_the_strategies_group():
    assert get_strategy_class("deepspeed") is DeepSpeedStrategy


def test_defaults_fill_everything_and_clip_at_one_as_accelerate_does():
    config = resolve_config(DeepSpeedPlugin(), values())
    assert config["train_micro_batch_size_per_gpu"] == 4
    assert config["gradient_accumulation_steps"] == 1
    assert config["train_batch_size"] == 8
    # Accelerate fills 1.0 when nobody sets it (DeepSpeed's own default, 0, would not clip).
    assert config["gradient_clipping"] == 1.0
    assert config["zero_optimization"]["stage"] == 2
    assert config["zero_allow_untested_optimizer"] is True
    assert "bf16" not in config and "fp16" not in config


def test_fp8_runs_the_engine_in_bf16_as_accelerate():
    # Accelerate's DeepSpeedPlugin.set_mixed_precision: fp8 keeps bf16 for the engine (the converted layers
    # compute in fp8); a config that turns bf16 off conflicts, naming both.
    assert resolve_config(DeepSpeedPlugin(), values(mixed_precision="fp8"))["bf16"] == {"enabled": True}
    auto = DeepSpeedPlugin(
        hf_ds_config={"zero_optimization": {}, "bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}}
    )
    config = resolve_config(auto, values(mixed_precision="fp8"))
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    with pytest.raises(
        DeepSpeedConfigError, match=r"`bf16.enabled` is False but the Accelerator's mixed_precision is 'fp8'"
    ):
        resolve_config(
            DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "bf16": {"enabled": False}}),
            values(mixed_precision="fp8"),
        )


def test_auto_values_are_filled_from_the_accelerator():
    user = {
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": {"stage": "auto", "offload_optimizer": {"device": "auto"}},
    }
    plugin = DeepSpeedPlugin(
        hf_ds_config=with_zero(user), gradient_clipping=0.5, zero_stage=3, offload_optimizer_device="cpu"
    )
    config = resolve_config(plugin, values(gradient_accumulation_steps=3, mixed_precision="bf16", micro_batch_size=2))
    assert config["train_micro_batch_size_per_gpu"] == 2
    assert config["gradient_accumulation_steps"] == 3
    assert config["train_batch_size"] == 2 * 3 * 2
    assert config["gradient_clipping"] == 0.5
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert user["zero_optimization"]["stage"] == "auto", "the user's dict must not be modified"


def test_config_values_win_over_unset_plugin_fields(tmp_path: Path):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps({"gradient_accumulation_steps": 4, "gradient_clipping": 2.0, "zero_optimization": {"stage": 1}})
    )
    plugin = DeepSpeedPlugin(hf_ds_config=str(path))
    assert plugin.zero_stage_resolved == 1
    config = resolve_config(plugin, values())
    assert (config["gradient_accumulation_steps"], config["gradient_clipping"]) == (4, 2.0)
    assert config["train_batch_size"] == 4 * 4 * 2


@pytest.mark.parametrize(
    ("user", "plugin", "accel", "message"),
    [
        (
            {"gradient_accumulation_steps": 4},
            {},
            {"gradient_accumulation_steps": 2},
            "DeepSpeed config `gradient_accumulation_steps` is 4 but the Accelerator's gradient_accumulation_steps is 2",
        ),
        (
            {"gradient_clipping": 1.0},
            {"gradient_clipping": 0.5},
            {},
            "DeepSpeed config `gradient_clipping` is 1.0 but DeepSpeedPlugin is 0.5",
        ),
        (
            {"zero_optimization": {"stage": 3}},
            {"zero_stage": 1},
            {},
            "DeepSpeed config `zero_optimization.stage` is 3 but DeepSpeedPlugin is 1",
        ),
        (
            {"train_micro_batch_size_per_gpu": 16},
            {},
            {},
            "DeepSpeed config `train_micro_batch_size_per_gpu` is 16 but the prepared data loader is 4",
        ),
        (
            {"train_batch_size": 64},
            {},
            {},
            "DeepSpeed config `train_batch_size` is 64 but micro batch x accumulation x processes is 8",
        ),
        (
            {"bf16": {"enabled": True}},
            {},
            {"mixed_precision": "no"},
            "DeepSpeed config `bf16.enabled` is True but the Accelerator's mixed_precision is 'no'",
        ),
        (
            {"fp16": {"enabled": False}},
            {},
            {"mixed_precision": "fp16"},
            "DeepSpeed config `fp16.enabled` is False but the Accelerator's mixed_precision is 'fp16'",
        ),
        (
            {"zero_optimization": {"offload_param": {"device": "nvme"}}},
            {"offload_param_device": "cpu"},
            {},
            "`zero_optimization.offload_param.device` is 'nvme' but DeepSpeedPlugin is 'cpu'",
        ),
    ],
)
def test_a_value_set_in_both_places_differently_is_an_error_naming_both(user, plugin, accel, message):
    with pytest.raises(DeepSpeedConfigError) as info:
        resolve_config(DeepSpeedPlugin(hf_ds_config=with_zero(user), **plugin), values(**accel))
    assert message in str(info.value)
    assert "Set the value in one place only" in str(info.value)


def test_equal_values_in_both_places_are_fine():
    user = {"gradient_accumulation_steps": 2, "gradient_clipping": 0.5, "zero_optimization": {"stage": 3}}
    plugin = DeepSpeedPlugin(
        hf_ds_config=with_zero(user), gradient_clipping=0.5, zero_stage=3, gradient_accumulation_steps=2
    )
    config = resolve_config(plugin, values(gradient_accumulation_steps=2))
    assert config["gradient_clipping"] == 0.5 and config["zero_optimization"]["stage"] == 3


def test_plugin_and_accelerator_accumulation_conflict():
    with pytest.raises(DeepSpeedConfigError, match=re.escape("DeepSpeedPlugin.gradient_accumulation_steps` is 4")):
        resolve_config(DeepSpeedPlugin(gradient_accumulation_steps=4), values(gradient_accumulation_steps=2))


def test_batch_size_needs_a_loader_or_a_config_value():
    with pytest.raises(DeepSpeedConfigError, match="requires you to pass at least one of training or evaluation"):
        resolve_config(DeepSpeedPlugin(), values(micro_batch_size=None))
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "train_micro_batch_size_per_gpu": 3}),
        values(micro_batch_size=None),
    )
    assert config["train_batch_size"] == 6


def test_unfillable_auto_is_named():
    user = {"zero_optimization": {"reduce_bucket_size": "auto"}, "steps_per_print": "auto"}
    with pytest.raises(DeepSpeedConfigError, match=r"\['steps_per_print'\] are \"auto\""):
        resolve_config(DeepSpeedPlugin(hf_ds_config=with_zero(user)), values(hidden_size=8))


def test_hidden_size_auto_keys_are_filled_from_the_model_as_accelerate_does():
    zero = {"stage": 3, **dict.fromkeys(HIDDEN_SIZE_KEYS, "auto")}
    config = resolve_config(DeepSpeedPlugin(hf_ds_config={"zero_optimization": zero}), values(hidden_size=64))
    got = {k: config["zero_optimization"][k] for k in HIDDEN_SIZE_KEYS}
    assert got == {
        "reduce_bucket_size": 64 * 64,
        "stage3_prefetch_bucket_size": int(0.9 * 64 * 64),
        "stage3_param_persistence_threshold": 640,
    }
    with pytest.raises(
        DeepSpeedConfigError,
        match=r"Can find neither `model.config.hidden_size` nor .*"
        r"\['zero_optimization.reduce_bucket_size', 'zero_optimization.stage3_prefetch_bucket_size'",
    ):
        resolve_config(DeepSpeedPlugin(hf_ds_config={"zero_optimization": zero}), values())
    # A model without any `config`: Accelerate's other text.
    with pytest.raises(DeepSpeedConfigError, match=r"^Can't find `model.config` entry, therefore it's not possible"):
        resolve_config(DeepSpeedPlugin(hf_ds_config={"zero_optimization": zero}), values(model_has_config=False))


def test_model_hidden_size_reads_hidden_size_or_the_largest_hidden_sizes():
    class Config:
        hidden_sizes = (16, 48, 32)

    class Model(torch.nn.Module):
        config = Config()

    assert model_hidden_size(Model()) == 48
    Config.hidden_size = 24  # type: ignore[attr-defined]
    assert model_hidden_size(Model()) == 24
    assert model_hidden_size(torch.nn.Linear(2, 2)) is None


def test_optimizer_and_scheduler_stand_ins():
    params = [torch.nn.Parameter(torch.zeros(2))]
    user = {
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto", "warmup_max_lr": "auto"}},
    }
    dummy = DummyOptim(params, lr=0.01, weight_decay=0.1)
    sched = DummyScheduler(dummy, warmup_num_steps=5)
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config=with_zero(user)),
        values(has_client_optimizer=False, dummy_optimizer=dummy, dummy_scheduler=sched),
    )
    assert config["optimizer"]["params"] == {"lr": 0.01, "weight_decay": 0.1, "torch_adam": True}
    assert config["scheduler"]["params"] == {"warmup_num_steps": 5, "warmup_max_lr": 0.01}
    assert "zero_allow_untested_optimizer" not in config
    with pytest.raises(
        DeepSpeedConfigError, match="You cannot specify an optimizer in the config file and in the code"
    ):
        resolve_config(DeepSpeedPlugin(hf_ds_config=with_zero(user)), values())
    with pytest.raises(DeepSpeedConfigError, match="You cannot create a `DummyOptim` without specifying an optimizer"):
        resolve_config(DeepSpeedPlugin(), values(has_client_optimizer=False, dummy_optimizer=dummy))
    with pytest.raises(RuntimeError, match="stand-in"):
        dummy.step()


def test_plugin_validation_and_config_file_errors(tmp_path: Path):
    with pytest.raises(ValueError, match="zero_stage must be 0, 1, 2 or 3"):
        DeepSpeedPlugin(zero_stage=4)
    with pytest.raises(ValueError, match="offload_param_device must be one of"):
        DeepSpeedPlugin(offload_param_device="gpu")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DeepSpeedPlugin(hf_ds_config=str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DeepSpeedConfigError, match="is not valid JSON"):
        DeepSpeedPlugin(hf_ds_config=bad)


def test_prepare_rules_with_the_seed_messages():
    acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2))
    assert acc.distributed_type == DistributedType.DEEPSPEED
    assert acc.scaler is None
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    # Accelerate 1.15 raises AssertionError (not ValueError) for a second model, with this text.
    assert MULTIPLE_MODELS == "You can't use same `Accelerator()` instance with multiple models when using DeepSpeed"
    with pytest.raises(AssertionError, match=f"^{re.escape(MULTIPLE_MODELS)}$") as info:
        acc.prepare(a, b, opt)
    assert type(info.value) is AssertionError
    with pytest.raises(ValueError, match=f"^{re.escape(DEVICE_PLACEMENT)}$"):
        acc.prepare(a, opt, device_placement=[True, True])
    assert DEVICE_PLACEMENT == "You can't customize device placements with DeepSpeed or Megatron-LM."
    with pytest.raises(ValueError, match="pass the model and its optimizer"):
        acc.prepare(opt)


def test_strategy_config_forms(tmp_path: Path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    assert DeepSpeedStrategy(str(path)).plugin.zero_stage_resolved == 3
    assert DeepSpeedStrategy({"zero_optimization": {"stage": 1}}).plugin.zero_stage_resolved == 1
    assert DeepSpeedStrategy().plugin.zero_stage_resolved == 2
    with pytest.raises(TypeError, match="takes a DeepSpeedPlugin"):
        DeepSpeedStrategy(3)
    with pytest.raises(ValueError, match="zero3_init needs ZeRO stage 3"):
        DeepSpeedStrategy().zero3_init(None)


class Payload:
    """A class no checkpoint should need: unpickling it means importing and calling test code."""


def test_engine_checkpoints_are_checked_before_deepspeed_unpickles_them(tmp_path: Path):
    from accel import CheckpointError, UnsafeCheckpointError
    from accel.strategies.deepspeed.strategy import verify_engine_checkpoint
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    tag = tmp_path / "pytorch_model"
    with pytest.raises(CheckpointError, match="has no DeepSpeed checkpoint"):
        verify_engine_checkpoint(tag)
    tag.mkdir()
    # What DeepSpeed itself writes passes.
    torch.save({"loss_scaler": LossScaler(1.0), "zero_stage": ZeroStageEnum(3), "w": torch.ones(2)}, tag / "a.pt")
    verify_engine_checkpoint(tag)
    torch.save({"payload": Payload()}, tag / "b.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"b\.pt: it references \['.*Payload'\]"):
        verify_engine_checkpoint(tag)
    (tag / "b.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        verify_engine_checkpoint(tag)


@pytest.mark.parametrize(
    ("user", "plugin", "expected"),
    [
        ({}, {}, False),
        ({}, {"offload_optimizer_device": "cpu"}, True),
        ({}, {"offload_optimizer_device": "none"}, False),
        ({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}}, {}, True),
        ({"zero_optimization": {"offload_optimizer": {"device": "auto"}}}, {}, False),
        ({"zero_optimization": {"offload_param": {"device": "cpu"}}}, {}, False),
        ({"zero_force_ds_cpu_optimizer": False}, {"offload_optimizer_device": "cpu"}, False),
        ({}, {"offload_optimizer_device": "cpu", "extra_config": {"zero_force_ds_cpu_optimizer": False}}, False),
    ],
)
def test_a_torch_optimizer_is_mapped_when_offloaded_unless_the_config_says_not(user, plugin, expected):
    # Accelerate: offload_optimizer.device != "none" and zero_force_ds_cpu_optimizer (default true).
    assert DeepSpeedPlugin(hf_ds_config=with_zero(user), **plugin).maps_client_optimizer is expected


class _FakeCPUOptimizer(torch.optim.Optimizer):
    """Records how the mapping built DeepSpeed's CPU optimizer (the real ones compile an op)."""

    def __init__(self, params, lr=1e-3, weight_decay=0.0, adamw_mode=None, **kwargs):
        self.kwargs = {"lr": lr, "weight_decay": weight_decay, "adamw_mode": adamw_mode, **kwargs}
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay, "betas": (0.9, 0.999), "eps": 1e-8})


class FakeCPUAdam(_FakeCPUOptimizer):
    pass


class FakeCPUAdagrad(_FakeCPUOptimizer):
    pass


@pytest.fixture
def fake_cpu_optimizers(monkeypatch):
    import types

    for module, name, cls in (
        ("deepspeed.ops.adam", "DeepSpeedCPUAdam", FakeCPUAdam),
        ("deepspeed.ops.adagrad", "DeepSpeedCPUAdagrad", FakeCPUAdagrad),
    ):
        monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(**{name: cls}))


@pytest.mark.parametrize(
    ("make", "cls", "adamw_mode", "warns"),
    [
        (lambda ps: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1, betas=(0.8, 0.9)), FakeCPUAdam, True, False),
        (lambda ps: torch.optim.Adam(ps, lr=0.02, weight_decay=0.1, betas=(0.8, 0.9)), FakeCPUAdam, False, False),
        (lambda ps: torch.optim.SGD(ps, lr=0.02, weight_decay=0.1), FakeCPUAdam, False, True),
        (lambda ps: torch.optim.Adagrad(ps, lr=0.02, weight_decay=0.1), FakeCPUAdagrad, None, False),
    ],
)
def test_the_mapping_picks_accelerates_cpu_optimizer_and_keeps_the_groups(
    fake_cpu_optimizers, caplog, make, cls, adamw_mode, warns
):
    from accel.strategies.deepspeed.strategy import map_pytorch_optim_to_deepspeed

    model = torch.nn.Linear(3, 2)
    client = make([{"params": [model.weight]}, {"params": [model.bias], "lr": 0.5}])
    with caplog.at_level("WARNING", logger="accel"):
        mapped = map_pytorch_optim_to_deepspeed(client)
    assert type(mapped) is cls
    expected = {"lr": 0.02, "weight_decay": 0.1}
    if cls is FakeCPUAdam:
        expected["adamw_mode"] = adamw_mode
    assert {k: v for k, v in mapped.kwargs.items() if v is not None} == expected
    # The same group dicts: per-group values (and a scheduler on the client optimizer) carry over.
    assert [g["lr"] for g in mapped.param_groups] == [0.02, 0.5]
    assert mapped.param_groups[0]["params"] == [model.weight]
    if isinstance(client, (torch.optim.Adam, torch.optim.AdamW)):
        assert mapped.param_groups[0]["betas"] == (0.8, 0.9)
    warned = [r.getMessage() for r in caplog.records if "DeepSpeedCPUAdam" in r.getMessage()]
    assert bool(warned) is warns, warned
    if warns:
        assert "SGD" in warned[0] and "zero_force_ds_cpu_optimizer" in warned[0]


SCHEDULER = {
    "type": "WarmupDecayLR",
    "params": dict.fromkeys(("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps"), "auto"),
}


@pytest.mark.parametrize(
    ("num_processes", "split_batches", "total", "expected_total"),
    [(1, False, 10, 10), (2, False, 10, 5), (3, False, 10, 4), (4, False, 7, 2), (3, True, 10, 10)],
)
def test_scheduler_auto_values_are_filled_as_accelerate_fills_them(num_processes, split_batches, total, expected_total):
    # Accelerate: warmup_min_lr 0, warmup_max_lr the optimizer's lr, warmup_num_steps at least 1, and
    # total_num_steps divided (rounding up) by the processes unless batches are split.
    params = [torch.nn.Parameter(torch.zeros(2))]
    user = {"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "scheduler": SCHEDULER}
    dummy = DummyOptim(params, lr=0.03)
    sched = DummyScheduler(dummy, total_num_steps=total, warmup_num_steps=0)
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config=with_zero(user)),
        values(
            has_client_optimizer=False,
            dummy_optimizer=dummy,
            dummy_scheduler=sched,
            num_processes=num_processes,
            split_batches=split_batches,
        ),
    )
    assert config["scheduler"]["params"] == {
        "warmup_min_lr": 0,
        "warmup_max_lr": 0.03,
        "warmup_num_steps": 1,
        "total_num_steps": expected_total,
    }
    assert SCHEDULER["params"]["total_num_steps"] == "auto", "the user's config must not be modified"


def test_scheduler_values_the_user_set_are_kept_and_a_torch_optimizer_gives_the_peak_lr():
    params = [torch.nn.Parameter(torch.zeros(2))]
    user = {
        "scheduler": {
            "type": "WarmupDecayLR",
            "params": {"warmup_min_lr": 1e-5, "warmup_max_lr": "auto", "warmup_num_steps": 3, "total_num_steps": 8},
        }
    }
    client = torch.optim.SGD(params, lr=0.2)
    config = resolve_config(
        DeepSpeedPlugin(hf_ds_config=with_zero(user)),
        values(dummy_scheduler=DummyScheduler(client, total_num_steps=100)),
    )
    assert config["scheduler"]["params"] == {
        "warmup_min_lr": 1e-5,
        "warmup_max_lr": 0.2,
        "warmup_num_steps": 3,
        "total_num_steps": 8,
    }
    # Without total_num_steps on the DummyScheduler, an "auto" total is named, not guessed.
    with pytest.raises(DeepSpeedConfigError, match=r"\['scheduler.params.total_num_steps'\] are \"auto\""):
        resolve_config(
            DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "scheduler": SCHEDULER}),
            values(dummy_scheduler=DummyScheduler(client, warmup_num_steps=2)),
        )


def test_a_dummy_optimizer_with_a_torch_scheduler_is_refused_as_accelerate_does():
    from accel.strategies.deepspeed.strategy import _scheduler_argument

    dummy = DummyOptim([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    torch_sched = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))]), 1)
    with pytest.raises(
        DeepSpeedConfigError, match=r"^You can only specify `DummyScheduler` in the code when using `DummyOptim`\.$"
    ):
        _scheduler_argument({"optimizer": {}}, torch_sched, None, dummy)
    assert _scheduler_argument({}, torch_sched, None, None) is torch_sched


def test_zero3_init_flag_resolves_as_accelerate_does():
    # Accelerate: unset means "on under ZeRO-3"; on under another stage is turned off with its warning.
    assert DeepSpeedPlugin(zero_stage=3).zero3_init_flag is True
    assert DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}}).is_zero3_init_enabled()
    assert DeepSpeedPlugin(zero_stage=2).zero3_init_flag is False
    assert DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False).zero3_init_flag is False
    with pytest.warns(UserWarning, match=r"^DeepSpeed Zero3 Init flag is only applicable for ZeRO Stage 3\. Setting"):
        plugin = DeepSpeedPlugin(zero_stage=2, zero3_init_flag=True)
    assert plugin.zero3_init_flag is False


def test_transformers_sees_zero3_only_while_the_flag_is_on():
    # What transformers' `is_deepspeed_zero3_enabled()` asks the registered object.
    strategy = DeepSpeedStrategy(DeepSpeedPlugin(zero_stage=3))
    awareness = strategy.zero3_awareness
    assert awareness.is_zero3()
    with strategy.plugin.zero3_init_context_manager(enable=False):
        assert not awareness.is_zero3()
    assert awareness.is_zero3()
    assert not DeepSpeedStrategy(DeepSpeedPlugin(zero_stage=3, zero3_init_flag=False)).zero3_awareness.is_zero3()
    with (
        pytest.raises(ValueError, match="zero3 init needs ZeRO stage 3"),
        DeepSpeedPlugin().zero3_init_context_manager(enable=True),
    ):
        pass
    # The config handed to deepspeed.zero.Init: stage 3, the run's 16-bit dtype, parameter offload from the config.
    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})
    assert DeepSpeedStrategy(plugin)._zero_init_config("bf16") == {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
        "bf16": {"enabled": True},
    }


def test_hf_deepspeed_config_reads_as_accelerates_and_is_the_plugins_live_config(tmp_path: Path):
    """`HfDeepSpeedConfig` (Accelerate's, which transformers subclasses) from a dict, a file, JSON and base64
    JSON; `DeepSpeedPlugin(hf_ds_config=...)` takes one (or makes one) whose `config` is the plugin's config, and
    transformers' Trainer's way of swapping it (`plugin.deepspeed_config = new.config`) is what the engine gets."""
    import base64
    import json

    from accel.utils import HfDeepSpeedConfig

    user = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}, "bf16": {"enabled": "auto"}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(user))
    encoded = base64.urlsafe_b64encode(json.dumps(user).encode()).decode()
    for source in (user, str(path), json.dumps(user), encoded):
        hf = HfDeepSpeedConfig(source)
        assert hf.config == user and hf.config is not user
        assert (hf.is_zero3(), hf.is_zero2(), hf.is_offload()) == (True, False, True)
        assert hf.get_value("zero_optimization.offload_param.device") == "cpu"
        assert hf.get_value("zero_optimization.missing.key", 7) == 7
        assert hf.is_true("bf16.enabled") and not hf.is_false("bf16.enabled")
    hf.del_config_sub_tree("zero_optimization.offload_param")
    assert "offload_param" not in hf.config["zero_optimization"]
    with pytest.raises(ValueError, match=r"Can't find a\.b entry in the config"):
        hf.del_config_sub_tree("a.b", must_exist=True)
    with pytest.raises(ValueError, match="Expected a string path to an existing deepspeed config"):
        HfDeepSpeedConfig("not json at all")

    given = HfDeepSpeedConfig({"zero_optimization": {"stage": 1}})
    plugin = DeepSpeedPlugin(hf_ds_config=given)
    assert plugin.hf_ds_config is given and plugin.deepspeed_config is given.config
    assert plugin.zero_stage_resolved == 1
    from_dict = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 3}})
    assert isinstance(from_dict.hf_ds_config, HfDeepSpeedConfig) and from_dict.hf_ds_config.is_zero3()
    assert from_dict.hf_ds_config.config is from_dict.deepspeed_config
    # transformers' Trainer: ds_plugin.hf_ds_config = Sub(ds_plugin.hf_ds_config.config);
    # ds_plugin.deepspeed_config = ds_plugin.hf_ds_config.config; then it fills "auto" in that dict.
    swapped = HfDeepSpeedConfig(plugin.hf_ds_config.config)
    plugin.hf_ds_config = swapped
    plugin.deepspeed_config = swapped.config
    swapped.config["gradient_clipping"] = 0.25
    config = resolve_config(plugin, values())
    assert config["gradient_clipping"] == 0.25 and config["zero_optimization"]["stage"] == 1


def test_an_engine_overflow_is_a_skipped_step():
    """Accelerate's DeepSpeed wrapper reports the engine optimizer's `overflow` (an fp16 step DeepSpeed skipped;
    its CPU accelerator has no fp16, so the engine optimizer here is a stand-in with that one attribute)."""
    from accel.prepare.wrappers import AcceleratedOptimizer
    from accel.strategies.deepspeed import DeepSpeedOptimizerWrapper

    class EngineOptimizer:
        param_groups: list = []
        overflow = False

    engine_optimizer = EngineOptimizer()
    prepared = AcceleratedOptimizer(DeepSpeedOptimizerWrapper(engine_optimizer))
    assert not prepared.step_was_skipped
    engine_optimizer.overflow = True
    assert prepared.step_was_skipped and prepared.is_overflow


def test_a_config_without_a_zero_section_is_refused_as_accelerate_does():
    with pytest.raises(DeepSpeedConfigError, match=r"^Please specify the ZeRO optimization config in the DeepSpeed"):
        DeepSpeedPlugin(hf_ds_config={"train_batch_size": 8})
    assert DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}}).zero_stage_resolved == 2  # {}: the defaults
    assert DeepSpeedPlugin().zero_stage_resolved == 2  # no config at all: the plugin's fields decide


def test_autotp_needs_one_tp_mesh_of_every_process():
    """As in Accelerate, AutoTP's `tp` mesh spans every process: another size is refused by name before any
    process group work."""
    from accel.strategies.deepspeed import DeepSpeedStrategy
    from accel.strategies.parallelism_config import MeshFacts

    plugin = DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "tensor_parallel": {"autotp_size": 2}})
    strategy = DeepSpeedStrategy(plugin)
    assert strategy.autotp_size == 2
    facts = MeshFacts(num_processes=4, use_distributed=True, device_type="cpu", capabilities=None, adapter_name="cpu")
    with pytest.raises(DeepSpeedConfigError, match=r"autotp_size=2 must equal the number of processes \(4\)"):
        strategy.learn_run(facts)
    assert DeepSpeedStrategy(DeepSpeedPlugin()).autotp_size == 0


def test_msamp_is_refused_by_name():
    with pytest.raises(DeepSpeedConfigError, match=r"enable_msamp=True: MS-AMP is not supported by accel"):
        DeepSpeedPlugin(enable_msamp=True, msamp_opt_level="O2")
    assert DeepSpeedPlugin(enable_msamp=False).enable_msamp is False
