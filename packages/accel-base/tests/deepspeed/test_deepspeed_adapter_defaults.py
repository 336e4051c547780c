"""`Adapter.strategy_defaults`: an adapter's DeepSpeed defaults fill only what nobody set; the
config, the plugin (its fields and `extra_config`) and the Accelerator all win over them.
Pure config resolution, plus one single-process engine showing the strategy asks the adapter."""

from __future__ import annotations

from typing import Any

import pytest
from accel.adapter.base import Adapter
from accel.strategies.deepspeed.config import AcceleratorValues, DeepSpeedPlugin, resolve_config
from conftest import launch

DEFAULTS = {
    "gradient_clipping": 1.0,
    "steps_per_print": 7,
    "zero_optimization": {"stage": 1, "overlap_comm": False},
}


def resolve(plugin: DeepSpeedPlugin, defaults: dict[str, Any] | None = DEFAULTS, **accel: Any) -> dict[str, Any]:
    values = {"micro_batch_size": 4, "gradient_accumulation_steps": 1, "num_processes": 2, "mixed_precision": "no"}
    return resolve_config(plugin, AcceleratorValues(**{**values, **accel}, has_client_optimizer=True), defaults)


def test_the_base_adapter_has_no_defaults():
    assert Adapter().strategy_defaults("deepspeed") == {}
    assert resolve(DeepSpeedPlugin(), None) == resolve(DeepSpeedPlugin(), {})


def test_defaults_replace_accels_own_when_nobody_sets_the_value():
    config = resolve(DeepSpeedPlugin())
    assert config["gradient_clipping"] == 1.0  # accel alone: 0.0
    assert config["zero_optimization"]["stage"] == 1  # accel alone: 2
    assert config["zero_optimization"]["overlap_comm"] is False and config["steps_per_print"] == 7
    # "auto" in the config is "nobody set it" too.
    auto = {"gradient_clipping": "auto", "steps_per_print": "auto", "zero_optimization": {"stage": "auto"}}
    config = resolve(DeepSpeedPlugin(hf_ds_config=auto))
    assert (config["gradient_clipping"], config["steps_per_print"], config["zero_optimization"]["stage"]) == (1.0, 7, 1)


@pytest.mark.parametrize(
    ("plugin", "key", "expected"),
    [
        (
            DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "gradient_clipping": 0.0}),
            ("gradient_clipping",),
            0.0,
        ),
        (DeepSpeedPlugin(gradient_clipping=0.25), ("gradient_clipping",), 0.25),
        (
            DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "gradient_clipping": 2.0}, gradient_clipping=2.0),
            ("gradient_clipping",),
            2.0,
        ),
        (DeepSpeedPlugin(zero_stage=3), ("zero_optimization", "stage"), 3),
        (DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"stage": 0}}), ("zero_optimization", "stage"), 0),
        (DeepSpeedPlugin(hf_ds_config={"zero_optimization": {}, "steps_per_print": 3}), ("steps_per_print",), 3),
        (DeepSpeedPlugin(extra_config={"steps_per_print": 5}), ("steps_per_print",), 5),
        (
            DeepSpeedPlugin(hf_ds_config={"zero_optimization": {"overlap_comm": True}}),
            ("zero_optimization", "overlap_comm"),
            True,
        ),
    ],
)
def test_every_user_setting_wins_over_the_adapters(plugin: DeepSpeedPlugin, key: tuple[str, ...], expected: Any):
    config = resolve(plugin)
    for part in key:
        config = config[part]
    assert config == expected


def test_the_accelerators_values_win_over_the_adapters():
    defaults = {"gradient_accumulation_steps": 8}
    assert resolve(DeepSpeedPlugin(), defaults)["gradient_accumulation_steps"] == 8
    assert resolve(DeepSpeedPlugin(), defaults, gradient_accumulation_steps=2)["gradient_accumulation_steps"] == 2


def test_the_users_defaults_are_not_mutated():
    defaults = {"zero_optimization": {"overlap_comm": False}}
    config = resolve(DeepSpeedPlugin(), defaults)
    config["zero_optimization"]["overlap_comm"] = True
    assert defaults == {"zero_optimization": {"overlap_comm": False}}


ENGINE = """
import torch
from accel import Accelerator
from accel.strategies.deepspeed import DeepSpeedPlugin

acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=0))
asked = []
def strategy_defaults(name):
    # An adapter whose users expect DeepSpeed to clip at 0.5.
    asked.append(name)
    return {"gradient_clipping": 0.5} if name == "deepspeed" else {}
acc.adapter.strategy_defaults = strategy_defaults
model = torch.nn.Linear(3, 1)
loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2)
engine, _, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
assert asked == ["deepspeed"], asked
assert acc.strategy.ds_config["gradient_clipping"] == 0.5, acc.strategy.ds_config
assert float(engine.gradient_clipping()) == 0.5
print("ENGINE CLIPS AT", engine.gradient_clipping())
"""


def test_the_strategy_asks_the_adapter_and_the_engine_uses_its_default(write_script):
    pytest.importorskip("deepspeed")
    proc = launch(write_script(ENGINE), nproc=1, timeout=900)
    assert "ENGINE CLIPS AT 0.5" in proc.stdout, proc.stdout
