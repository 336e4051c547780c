"""Accelerate's DeepSpeedPlugin fields that shape the engine, on DeepSpeed's CPU accelerator (one process, in
this process): `is_train_batch_min` picks the micro-batch from the train and eval loaders, and
`transformer_moe_cls_names` makes mixture-of-experts layers ZeRO-3 leaves."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("deepspeed")


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def _engine(plugin: object) -> tuple[object, nn.Module]:
    from accel import Accelerator
    from accel.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator(deepspeed_plugin=plugin)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), Expert(), nn.Linear(8, 1))
    train = torch.utils.data.DataLoader(torch.randn(16, 8), batch_size=4)
    evaluation = torch.utils.data.DataLoader(torch.randn(16, 8), batch_size=8)
    engine, *_ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), train, evaluation)
    return engine, model


@pytest.mark.parametrize(("smallest", "micro_batch"), [(True, 4), (False, 8)])
def test_is_train_batch_min_picks_the_micro_batch_from_the_train_and_eval_loaders(smallest: bool, micro_batch: int):
    from accel.strategies.deepspeed import DeepSpeedPlugin

    engine, _ = _engine(DeepSpeedPlugin(zero_stage=1, is_train_batch_min=smallest))
    assert engine.train_micro_batch_size_per_gpu() == micro_batch  # type: ignore[attr-defined]


def test_transformer_moe_cls_names_make_zero3_leaf_modules():
    from accel.strategies.deepspeed import DeepSpeedPlugin
    from deepspeed.utils import z3_leaf_module

    engine, model = _engine(DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Expert"))
    assert z3_leaf_module(engine.module[1]) and not z3_leaf_module(engine.module[0])  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="Could not find a transformer layer class called 'Router' to wrap"):
        DeepSpeedPlugin(zero_stage=3, transformer_moe_cls_names="Expert,Router").moe_leaf_classes(model)
