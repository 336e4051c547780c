"""torch.compile on XLA: `openxla` (torch's dynamo backend that hands graphs to torch_xla) is the default and the
only backend; inductor is refused by name when the Accelerator is built."""

from __future__ import annotations

import pytest
import torch
from accel import Accelerator
from accel.errors import CompileNotSupportedError
from accel.prepare.wrappers import is_compiled_module
from xla_helpers import cpu_weights, loader, model, train, train_plain


@pytest.mark.parametrize("emulate", [False, True])
def test_inductor_is_refused_by_name(emulate: bool) -> None:
    if not emulate:
        pytest.importorskip("torch_xla")
    runs = "aot_eager" if emulate else "openxla"
    with pytest.raises(
        CompileNotSupportedError, match=rf"does not run the torch.compile backend 'inductor'; it runs \['{runs}'\]"
    ):
        Accelerator(adapter="xla", emulate=emulate, dynamo_backend="inductor")


def test_default_backend_is_openxla_and_trains_like_plain_torch() -> None:
    pytest.importorskip("torch_xla")
    import torch_xla.debug.metrics as met

    acc = Accelerator(dynamo_backend="default")
    net = model()
    reference = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    net, opt, dl = acc.prepare(net, opt, loader())
    assert is_compiled_module(net)
    train(acc, net, opt, dl)
    # torch_xla counts the graphs dynamo handed it: the openxla backend ran.
    assert met.counter_value("DynamoExtractCompiledGraph")
    train_plain(reference, torch.optim.SGD(reference.parameters(), lr=0.05), loader())
    for a, b in zip(cpu_weights(acc.unwrap_model(net)), cpu_weights(reference)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_openxla_under_emulation_compiles_with_its_stand_in() -> None:
    acc = Accelerator(adapter="xla", emulate=True, dynamo_backend="openxla")
    net = model()
    reference = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    net, opt, dl = acc.prepare(net, opt, loader())
    assert is_compiled_module(net)
    train(acc, net, opt, dl)
    train_plain(reference, torch.optim.SGD(reference.parameters(), lr=0.05), loader())
    for a, b in zip(cpu_weights(acc.unwrap_model(net)), cpu_weights(reference)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
