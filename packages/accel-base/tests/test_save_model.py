"""save_model: safetensors that load strictly into a plain module, tied weights and shards included."""

from __future__ import annotations

import json

import torch
from accel import Accelerator
from safetensors.torch import load_file


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.body = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 10, bias=False)
        self.head.weight = self.embed.weight


def test_single_file_with_tied_weights_loads_strictly(tmp_path) -> None:
    acc = Accelerator()
    model = acc.prepare(Tied())
    acc.save_model(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    fresh = Tied()
    fresh.load_state_dict(load_file(tmp_path / "model.safetensors"), strict=True)
    for name, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], value), name


def test_shards_and_index_above_max_shard_size(tmp_path) -> None:
    acc = Accelerator()
    model = acc.prepare(torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)]))
    acc.save_model(model, tmp_path, max_shard_size="5KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 1
    merged: dict[str, torch.Tensor] = {}
    for name in shard_files:
        merged.update(load_file(tmp_path / name))
    assert set(merged) == set(index["weight_map"]) == set(model.state_dict())
    plain = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
    plain.load_state_dict(merged, strict=True)
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in model.state_dict().items())
