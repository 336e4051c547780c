"""`ipex.optimize`'s own options as adapter options (`Accelerator(adapter_options=...)`, `ACCEL_IPEX_*`,
`--ipex-*`), each shown by what IPEX does to the prepared model, never by what accel passes: the layer classes
IPEX swaps in, the layers it folds away, the optimizer step it fuses, the masters it keeps."""

from __future__ import annotations

import argparse
import copy

import pytest
import torch
from accel import Accelerator
from accel.testing.pytest_plugin import reset_state
from accel_ipex import IpexAdapter, IpexOptions
from ipex_models import Net, batch
from torch import nn


class Head(nn.Module):
    """Linear -> BatchNorm1d, two Linear layers reading one input, an LSTM: every eval-mode rewrite of IPEX's."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.1)
        self.q = nn.Linear(32, 8)
        self.k = nn.Linear(32, 8)
        self.lstm = nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.bn(self.fc(x)))
        return self.lstm((self.q(h) * self.k(h)).unsqueeze(1))[0].squeeze(1)


def _start() -> nn.Module:
    torch.manual_seed(0)
    model = Head()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return model.eval()


def evaluated(**options: object) -> tuple[nn.Module, dict[str, str]]:
    """The eval-mode prepared model (its output checked against the plain one) and its layers' classes."""
    start = _start()
    reset_state()  # each call its own Accelerator, with these options
    acc = Accelerator(adapter_options=options)
    model = acc.prepare_model(copy.deepcopy(start), evaluation_mode=True)
    x = batch(0)[0]
    with torch.no_grad():
        torch.testing.assert_close(model(x), start(x), rtol=1e-5, atol=1e-5)
    return model, {name: type(layer).__name__ for name, layer in model.named_children()}


def test_evaluation_defaults_fold_drop_and_swap_the_lstm() -> None:
    _, layers = evaluated()
    assert "bn" not in layers and layers["drop"] == "Identity" and layers["lstm"] == "_LSTM"
    assert "k" in layers  # concat_linear is off by default


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"conv_bn_folding": False, "linear_bn_folding": False}, {"bn": "BatchNorm1d"}),
        ({"replace_dropout_with_identity": False}, {"drop": "Dropout"}),
        ({"optimize_lstm": False}, {"lstm": "LSTM"}),
        ({"concat_linear": True}, {"k": None}),  # q and k read the same input: one concatenated Linear
    ],
    ids=["bn_folding", "dropout", "lstm", "concat_linear"],
)
def test_each_evaluation_option_changes_what_ipex_builds(options: dict[str, bool], expected: dict[str, str]) -> None:
    _, layers = evaluated(**options)
    for name, cls in expected.items():
        assert layers.get(name) == cls, (name, layers)


def test_linear_bn_folding_alone_folds_the_batchnorm() -> None:
    _, layers = evaluated(conv_bn_folding=False, linear_bn_folding=True)
    assert "bn" not in layers


def test_auto_kernel_selection_picks_onednn_for_fp32_linear() -> None:
    model, _ = evaluated(auto_kernel_selection=True)
    assert model.fc.use_dnnl is True
    assert evaluated()[0].fc.use_dnnl is False  # IPEX's default: MKL's kernel


def test_graph_mode_runs_the_forward_as_a_traced_graph() -> None:
    model, _ = evaluated(graph_mode=True)
    captures = [
        c.cell_contents for c in model.forward.__closure__ or () if type(c.cell_contents).__name__ == "GraphCapture"
    ]
    assert len(captures) == 1 and captures[0].method.name in ("JIT", "TorchDynamo")


def _train(**options: object) -> tuple[nn.Module, torch.optim.Optimizer, Accelerator]:
    reset_state()
    acc = Accelerator(adapter_options=options, mixed_precision=str(options.pop("precision", "no")))
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, opt = acc.prepare(model, opt)
    x, y = batch(0)
    acc.backward(nn.functional.mse_loss(model(x).float(), y))
    opt.step()
    return model, opt, acc


def test_level_o0_reaches_ipex_optimize() -> None:
    """At O0 IPEX changes neither layers nor the optimizer's step (fp32); at O1 it prepacks the conv and fuses."""
    model, opt, _ = _train(level="O0")
    assert type(model.conv) is nn.Conv2d and opt.optimizer.step.__name__ == "step"
    model, opt, _ = _train(level="O1")
    assert type(model.conv) is not nn.Conv2d and opt.optimizer.step.__name__ == "sgd_step"


def test_fuse_update_step_off_keeps_torchs_step() -> None:
    _, opt, _ = _train(fuse_update_step=False)
    assert opt.optimizer.step.__name__ == "step"


def test_split_master_weight_for_bf16_off_keeps_whole_fp32_masters() -> None:
    split, _, _ = _train(precision="bf16")
    whole, _, _ = _train(precision="bf16", split_master_weight_for_bf16=False)
    assert split.fc1.weight.dtype == whole.fc1.weight.dtype == torch.bfloat16
    assert split.fc1.weight_wrapper.split is True and split.fc1.weight_wrapper.master_parameter is None
    master = whole.fc1.weight_wrapper.master_parameter
    assert whole.fc1.weight_wrapper.split is False and master.dtype == torch.float32
    torch.testing.assert_close(master.to(torch.bfloat16), whole.fc1.weight)
    # Both hold fp32 masters in the state dict, one step apart only by the two update kernels' rounding.
    torch.testing.assert_close(split.state_dict()["fc1.weight"], whole.state_dict()["fc1.weight"], rtol=0, atol=1e-4)


def test_options_come_from_flags_and_variables() -> None:
    parser = argparse.ArgumentParser()
    IpexAdapter.add_launch_arguments(parser.add_argument_group("ipex"))
    args = parser.parse_args(["--ipex-concat-linear", "on", "--ipex-fuse-update-step", "off"])
    env = IpexAdapter.launch_env(args)
    assert env == {"ACCEL_IPEX_CONCAT_LINEAR": "1", "ACCEL_IPEX_FUSE_UPDATE_STEP": "0"}
    options = IpexOptions.from_env({**env, "ACCEL_IPEX_GRAPH_MODE": "default"})
    assert options.optimize_kwargs() == {"fuse_update_step": False, "concat_linear": True}
