"""Prepared loaders, gather_for_metrics and checkpoints on the real XLA device."""

from __future__ import annotations

from pathlib import Path

import pytest

torch_xla = pytest.importorskip("torch_xla")

import torch  # noqa: E402
from accel import Accelerator  # noqa: E402
from accel.state import AcceleratorState, GradientState  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from xla_helpers import cpu_weights, dataset, loader, model, train  # noqa: E402


def test_batches_arrive_on_the_device_and_gather_for_metrics_is_exact() -> None:
    acc = Accelerator()
    dl = acc.prepare(loader(n=10, batch_size=4))
    seen_x, seen_end = [], []
    for x, _ in dl:
        assert x.device.type == "xla"
        seen_x.append(acc.gather_for_metrics(x).to("cpu"))
        seen_end.append(acc.gradient_state.end_of_dataloader)
    assert seen_end == [False, False, True]
    torch.testing.assert_close(torch.cat(seen_x), dataset(10).tensors[0], rtol=0, atol=0)


def _setup(acc: Accelerator) -> tuple[torch.nn.Module, torch.optim.Optimizer, object]:
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    return acc.prepare(net, opt, loader(shuffle=True))  # type: ignore[no-any-return]


def test_save_and_load_state_resume_exactly(tmp_path: Path) -> None:
    acc = Accelerator()
    net, opt, dl = _setup(acc)
    train(acc, net, opt, dl)
    acc.save_state(tmp_path / "ckpt")
    train(acc, net, opt, dl)
    uninterrupted = cpu_weights(net)

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    acc = Accelerator()
    net, opt, dl = _setup(acc)
    acc.load_state(tmp_path / "ckpt")
    assert net[0].weight.device.type == "xla"
    assert all(s["exp_avg"].device.type == "xla" for s in opt.state.values())
    train(acc, net, opt, dl)
    for a, b in zip(cpu_weights(net), uninterrupted):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_checkpoint_files_hold_host_tensors(tmp_path: Path) -> None:
    acc = Accelerator()
    net, opt, dl = _setup(acc)
    train(acc, net, opt, dl)
    acc.save_state(tmp_path / "ckpt")
    weights = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    assert all(t.device.type == "cpu" for t in weights.values())
    # Written from the host: it loads as it is (storages tagged xla:0 would not restore).
    state = torch.load(tmp_path / "ckpt" / "optimizer.bin", weights_only=True)
    assert all(v.device.type == "cpu" for s in state["state"].values() for v in s.values())


def test_save_model_loads_into_a_plain_module(tmp_path: Path) -> None:
    acc = Accelerator()
    net, opt, dl = _setup(acc)
    train(acc, net, opt, dl)
    acc.save_model(net, tmp_path / "out")
    plain = model()
    plain.load_state_dict(load_file(str(tmp_path / "out" / "model.safetensors")), strict=True)
    for a, b in zip(cpu_weights(plain), cpu_weights(net)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_shuffled_loader_reshuffles_every_epoch_from_the_seed_on_the_device() -> None:
    """A shuffling loader keeps its own CPU generator (Accelerate gives one to XLA loaders; here the core's
    synchronised sampler generator, which every rank shares: test_conformance.py's sharding check, 2 ranks):
    each epoch a new order of every sample, the same orders again after the same `set_seed`."""
    from accel.utils import set_seed
    from torch.utils.data import DataLoader, TensorDataset

    def orders() -> list[list[int]]:
        set_seed(3)
        acc = Accelerator()
        dl = acc.prepare(DataLoader(TensorDataset(torch.arange(12)), batch_size=4, shuffle=True))
        epochs = [[int(v) for (b,) in dl for v in b.to("cpu")] for _ in range(2)]
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        return epochs

    first = orders()
    assert [sorted(e) for e in first] == [list(range(12))] * 2
    assert first[0] != first[1]
    assert orders() == first
