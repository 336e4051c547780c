"""`torch.compile` on the IPEX path (and FSDP2, refused) (Accelerate's `dynamo_backend="ipex"`): the ipex.optimize'd model compiled
with IPEX's backend trains to the numbers eager IPEX gives; a backend IPEX does not run is refused by name."""

from __future__ import annotations

import copy

import pytest
import torch
from accel import Accelerator
from accel.errors import CompileNotSupportedError
from accel.testing.pytest_plugin import reset_state
from ipex_models import Net, batch
from torch import nn


def _train(start: nn.Module, **kwargs: object) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    reset_state()
    acc = Accelerator(**kwargs)
    model = copy.deepcopy(start)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = acc.prepare(model, opt)
    for step in range(3):
        x, y = batch(step)
        acc.backward(nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
    return model, acc.unwrap_model(model, keep_torch_compile=False).state_dict()


def test_ipex_backend_compiles_the_optimized_model_and_trains_as_eager() -> None:
    torch.manual_seed(0)
    start = Net()
    eager_model, eager = _train(start)
    compiled_model, compiled = _train(start, dynamo_backend="ipex")
    assert not hasattr(eager_model, "_orig_mod") and hasattr(compiled_model, "_orig_mod")
    assert type(compiled_model._orig_mod.conv) is not nn.Conv2d  # ipex.optimize ran before compilation
    for key, value in eager.items():
        torch.testing.assert_close(compiled[key], value, rtol=0, atol=1e-6)


def test_a_backend_ipex_does_not_run_is_refused_by_name() -> None:
    with pytest.raises(
        CompileNotSupportedError,
        match=r"The 'ipex' adapter does not run the torch.compile backend 'cudagraphs'; it runs \['inductor', 'ipex'\]",
    ):
        Accelerator(dynamo_backend="cudagraphs")


def test_fsdp2_is_refused_by_name() -> None:
    """FSDP2 under IPEX is refused (the README's differences table gives the reason, measured on 2 gloo ranks)."""
    from accel.errors import StrategyNotSupportedError

    with pytest.raises(StrategyNotSupportedError, match=r"^The 'ipex' adapter does not support the 'fsdp2' strategy"):
        Accelerator(strategy="fsdp2")
