"""Accelerate's `FullyShardedDataParallelPlugin` fields as users write them: `transformer_cls_names_to_wrap` as one
comma-separated string (Accelerate splits it on commas; accel once read it letter by letter)."""

from __future__ import annotations

import pytest
from accel import FullyShardedDataParallelPlugin
from accel.strategies.fsdp import wrap_targets
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        ("Block", ["Block"]),
        ("Block,MLP", ["Block", "MLP"]),
        ("Block, MLP", ["Block", "MLP"]),
        (["Block", "MLP"], ["Block", "MLP"]),
        ([Block], [Block]),
    ],
)
def test_transformer_cls_names_to_wrap_string_is_split_on_commas(names, expected):
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=names
    )
    assert list(plugin.transformer_cls_names_to_wrap) == expected
    model = Net()
    targets = wrap_targets(model, plugin)
    wanted = {n if isinstance(n, str) else n.__name__ for n in expected}
    # Every module of the named classes, innermost first, and nothing else.
    assert [type(m).__name__ for m in targets] == [
        type(m).__name__ for m in reversed(list(model.modules())) if type(m).__name__ in wanted
    ]
    assert len(targets) == 2 * len(wanted)


def test_a_misspelt_class_name_is_named_whole():
    plugin = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap="Block,Blok"
    )
    with pytest.raises(ValueError, match=r"Could not find the transformer layer class \['Blok'\] in the model"):
        wrap_targets(Net(), plugin)


def test_the_split_matches_accelerates():
    accelerate = pytest.importorskip("accelerate", reason="needs accelerate==1.15.0 (nox -s compat installs it)")
    theirs = accelerate.FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap="Block,MLP"
    )
    ours = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap="Block,MLP"
    )
    assert list(ours.transformer_cls_names_to_wrap) == list(theirs.transformer_cls_names_to_wrap)
