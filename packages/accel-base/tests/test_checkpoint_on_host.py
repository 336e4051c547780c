"""`Adapter.checkpoint_on_host`: optimizer state and registered objects are written as host
tensors and read onto the host, then placed by the optimizer's own `load_state_dict`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from accel import Accelerator
from accel.checkpoint import state as ckpt
from accel.checkpoint import validate as checkpoint_validate


class _Counter:
    def __init__(self) -> None:
        self.value = torch.zeros(2)

    def state_dict(self) -> dict[str, Any]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.value = state["value"]


def _trained(acc: Accelerator) -> tuple[torch.nn.Module, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    acc.backward(model(torch.randn(4, 3)).sum())
    opt.step()
    return model, opt


@pytest.mark.parametrize("on_host", [False, True])
def test_optimizer_state_goes_through_the_host_when_the_adapter_asks(
    on_host: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    acc = Accelerator()
    monkeypatch.setattr(acc.adapter, "checkpoint_on_host", on_host)
    model, opt = _trained(acc)
    counter = _Counter()
    counter.value += 3
    acc.register_for_checkpointing(counter)
    moved: list[Any] = []
    real_send = ckpt.send_to_device
    monkeypatch.setattr(ckpt, "send_to_device", lambda data, device: moved.append(device) or real_send(data, device))
    acc.save_state(tmp_path / "c")
    assert moved == ([torch.device("cpu")] * 2 if on_host else [])

    saved = {k: v.clone() for k, v in opt.state[model.weight].items()}
    opt.state.clear()
    counter.value = torch.zeros(2)
    locations: list[Any] = []
    real_load = checkpoint_validate.load_torch
    monkeypatch.setattr(
        checkpoint_validate,  # where load_state reads its files
        "load_torch",
        lambda path, map_location="cpu", **kw: locations.append(map_location) or real_load(path, map_location, **kw),
    )
    acc.load_state(tmp_path / "c")
    # The optimizer file is the first one read with a location of its own.
    assert locations[0] == ("cpu" if on_host else acc.device)
    for key, value in saved.items():
        torch.testing.assert_close(opt.state[model.weight][key], value, rtol=0, atol=0)
    torch.testing.assert_close(counter.value, torch.full((2,), 3.0))
