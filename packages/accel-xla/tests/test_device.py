"""The xla adapter on torch_xla's real CPU device (`PJRT_DEVICE=CPU`): device, backend,
the optimizer trap, precision and launch flags."""

from __future__ import annotations

import argparse
import os

import pytest

torch_xla = pytest.importorskip("torch_xla")

import torch  # noqa: E402
from accel import Accelerator  # noqa: E402
from accel_xla import XLAAdapter  # noqa: E402
from xla_helpers import cpu_weights, loader, model, train, train_plain  # noqa: E402


def test_device_comes_from_torch_xla_and_backend_is_xla() -> None:
    acc = Accelerator()
    assert acc.adapter.name == "xla"
    assert acc.device == torch_xla.device()
    assert acc.device.type == "xla"
    assert acc.adapter.backend == "xla"
    kind = os.environ["PJRT_DEVICE"]
    assert acc.adapter.vendor.device_kind() == kind
    assert f"pjrt_device={kind}" in acc.adapter.describe()


@pytest.mark.skipif(os.environ.get("PJRT_DEVICE") != "CPU", reason="checks a host without TPUs")
def test_availability_needs_a_tpu_or_pjrt_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert XLAAdapter.availability().reason == "PJRT_DEVICE=CPU"
    monkeypatch.delenv("PJRT_DEVICE")
    avail = XLAAdapter.availability()
    # This machine has no TPU: without PJRT_DEVICE the adapter is never picked by itself.
    assert not avail and "PJRT_DEVICE=CPU" in avail.reason


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.Adam])
def test_optimizer_built_before_the_move_trains_like_one_built_after(opt_cls: type) -> None:
    acc = Accelerator()
    early = model()
    opt_early = opt_cls(early.parameters(), lr=0.05)
    early, opt_early, dl = acc.prepare(early, opt_early, loader())
    assert early[0].weight.device.type == "xla"
    assert opt_early.param_groups[0]["params"][0] is early[0].weight
    train(acc, early, opt_early, dl)

    late = model().to(acc.device)
    opt_late = opt_cls(late.parameters(), lr=0.05)
    late, opt_late, dl = acc.prepare(late, opt_late, loader())
    train(acc, late, opt_late, dl)

    start = cpu_weights(model())
    for a, b, s in zip(cpu_weights(early), cpu_weights(late), start):
        assert not torch.equal(a, s)  # it trained
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    reference = model()
    ref_opt = opt_cls(reference.parameters(), lr=0.05)
    train_plain(reference, ref_opt, loader())
    for a, r in zip(cpu_weights(early), cpu_weights(reference)):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)


def test_existing_adam_state_moves_with_the_parameters() -> None:
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    batches = list(loader())
    train_plain(net, opt, batches[:3])
    acc = Accelerator()
    net, opt = acc.prepare(net, opt)
    params = list(net.parameters())
    assert set(opt.state) == set(params)
    assert all(opt.state[p]["exp_avg"].device.type == "xla" for p in params)
    train(acc, net, opt, [(x.to(acc.device), y.to(acc.device)) for x, y in batches[3:]])

    reference = model()
    ref_opt = torch.optim.Adam(reference.parameters(), lr=0.05)
    train_plain(reference, ref_opt, batches)
    for a, r in zip(cpu_weights(net), cpu_weights(reference)):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)


def test_optimizer_prepared_in_a_later_call_is_repointed() -> None:
    acc = Accelerator()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    net = acc.prepare(net)
    opt = acc.prepare(opt)
    assert opt.param_groups[0]["params"][0] is net[0].weight


def test_tied_weights_stay_tied_on_the_device() -> None:
    net = torch.nn.Sequential(torch.nn.Embedding(5, 3), torch.nn.Linear(3, 5, bias=False))
    net[1].weight = net[0].weight
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net, opt = Accelerator().prepare(net, opt)
    assert net[0].weight is net[1].weight
    assert opt.param_groups[0]["params"] == [net[0].weight]


@pytest.mark.parametrize("placement", [True, False])
def test_model_moved_by_hand_after_the_optimizer_is_refused(placement: bool) -> None:
    acc = Accelerator(device_placement=placement)
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    net.to(acc.device)
    with pytest.raises(ValueError, match=r"not on the same device.*\*\*before\*\* putting on the device"):
        acc.prepare(net, opt)


def test_bf16_autocast_on_xla_and_fp16_refused() -> None:
    acc = Accelerator(mixed_precision="bf16")
    a = torch.randn(4, 4, device=acc.device)
    with acc.autocast():
        assert (a @ a).dtype == torch.bfloat16
    net = model()
    before = [w.detach().clone() for w in net.parameters()]
    net, opt, dl = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.05), loader())
    train(acc, net, opt, dl)
    after = cpu_weights(net)
    assert all(torch.isfinite(w).all() for w in after)
    assert any(not torch.equal(a, b) for a, b in zip(after, before)), "bf16 training moved no weight"

    from accel.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(ValueError, match=r"'xla' adapter does not support mixed_precision='fp16'.*'bf16'"):
        Accelerator(mixed_precision="fp16")


def test_clipping_matches_the_plain_loop() -> None:
    acc = Accelerator()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    net, opt, dl = acc.prepare(net, opt, loader())
    train(acc, net, opt, dl, clip=0.5)
    reference = model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    train_plain(reference, ref_opt, loader(), clip=0.5)
    for a, r in zip(cpu_weights(net), cpu_weights(reference)):
        torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)


def test_strategies_other_than_xla_ddp_are_refused_and_ddp_means_xla_ddp() -> None:
    from accel.errors import StrategyNotSupportedError

    with pytest.raises(StrategyNotSupportedError, match=r"The 'xla' adapter does not support the 'fsdp2' strategy"):
        Accelerator(strategy="fsdp2")


def test_data_parallelism_is_the_xla_ddp_strategy_by_default() -> None:
    from accel_xla import XLADataParallelStrategy

    acc = Accelerator()
    assert type(acc.strategy) is XLADataParallelStrategy and acc.strategy.name == "xla_ddp"
    # Its torch_xla calls go through the adapter's vendor module, handed over with the strategy's defaults.
    assert acc.adapter.strategy_defaults("xla_ddp") == {"vendor": acc.adapter.vendor}
    assert acc.adapter.strategy_defaults("ddp") == {}
    net = model()
    net, _ = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert type(net) is torch.nn.Sequential  # no wrapper


def test_xla_ddp_refuses_settings_and_other_adapters() -> None:
    from accel.prepare.context import PrepareContext
    from accel_xla import XLADataParallelStrategy

    with pytest.raises(ValueError, match="The xla_ddp strategy takes no settings"):
        XLADataParallelStrategy({"bucket_cap_mb": 25})
    strategy = XLADataParallelStrategy()
    # Another adapter hands over no vendor module (`strategy_defaults`): refused, not silently unaveraged.
    from accel.adapter.cpu import CPUAdapter

    ctx = PrepareContext(
        device=torch.device("cpu"),
        device_placement=False,
        strategy=strategy,
        use_distributed=True,
        adapter=CPUAdapter(),
    )
    with pytest.raises(ValueError, match="runs on the xla adapter only"):
        strategy.wrap_model(model(), ctx)


def test_launch_flags_set_the_pjrt_device() -> None:
    parser = argparse.ArgumentParser()
    XLAAdapter.add_launch_arguments(parser.add_argument_group("xla"))
    args = parser.parse_args(["--pjrt-device", "cpu", "--xla-cpu-devices", "2"])
    assert XLAAdapter.launch_env(args) == {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    assert XLAAdapter.launch_env(parser.parse_args([])) == {}
    with pytest.raises(ValueError, match="needs --pjrt-device CPU"):
        XLAAdapter.launch_env(parser.parse_args(["--pjrt-device", "TPU", "--xla-cpu-devices", "2"]))


def test_vendor_module_and_its_stand_in_are_in_step() -> None:
    import inspect

    from accel_xla import xla, xla_emulated

    def public(module: object) -> set[str]:
        return {
            n
            for n, f in inspect.getmembers(module, inspect.isfunction)
            if f.__module__ == module.__name__ and not n.startswith("_")
        }  # type: ignore[attr-defined]

    # generator is what the conformance kit draws the emulated device's randomness from
    # (accel.testing.checks_vendor).
    assert public(xla) == public(xla_emulated) - {"generator"}


def test_replaced_host_parameters_are_freed_after_repointing() -> None:
    import gc
    import weakref

    acc = Accelerator()
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    old = weakref.ref(net[0].weight)
    net, opt = acc.prepare(net, opt)
    gc.collect()
    assert old() is None  # the adapter keeps no host copy of the weights alive


def test_rng_types_xla_and_the_rendezvous_run_on_the_device() -> None:
    """`rng_types=["xla"]` reads and keeps the device's XLA seed (one replica: nothing to copy; 2 emulated ranks in
    test_distributed.py) and prepared loaders synchronise it on each iteration; the adapter's barrier
    (`wait_for_everyone` with several replicas) is torch_xla's rendezvous, which returns on one replica."""
    import torch_xla.core.xla_model as xm
    from accel.utils import synchronize_rng_states

    acc = Accelerator(rng_types=["xla"])
    xm.set_rng_state(1234)
    synchronize_rng_states(["xla"])
    assert xm.get_rng_state() == 1234 == acc.adapter.get_device_rng_state()
    dl = acc.prepare(loader(n=16, batch_size=8, shuffle=True))
    assert len(list(dl)) == 2
    acc.adapter.barrier()
