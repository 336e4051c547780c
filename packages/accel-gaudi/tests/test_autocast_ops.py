"""optimum-habana's `use_torch_autocast` and its `autocast_bf16_ops` / `autocast_fp32_ops` lists (trainer.py's
`declare_autocast_bf16_fp32_ops`): the lists are written to files named by `PT_HPU_AUTOCAST_*_OPS_LIST` before
Habana's autocast reads them, and the (emulated) autocast runs each listed op in its list's dtype."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from accel import Accelerator
from accel.adapter.options import AdapterOptionsError
from accel.cli import _launch_parser, worker_env
from accel.state import AcceleratorState, GradientState
from accel_gaudi import GaudiOptions
from accel_gaudi.autocast_ops import FP32_LIST_ENV, LOWER_PRECISION_LIST_ENV
from torch import nn


class Probe(nn.Module):
    """A linear layer, a softmax and a division, recording the dtype each produced."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        p = torch.softmax(h, dim=-1)
        q = h / 2
        self.seen.update(linear=h.dtype, softmax=p.dtype, truediv=q.dtype)
        return p + q


def fresh_accelerator(options: dict) -> Accelerator:
    """A new Accelerator (and adapter) with `options`: the state is one per process, as in Accelerate."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    return Accelerator(adapter="gaudi", emulate=True, adapter_options=options)


def run(options: dict) -> dict[str, torch.dtype]:
    acc = fresh_accelerator(options)
    torch.manual_seed(0)
    model = acc.prepare(Probe())
    out = model(torch.randn(3, 4))
    assert out.dtype == torch.float32  # outputs come back in fp32, as under any autocast wrapper
    out.sum().backward()
    assert model.fc.weight.grad.dtype == torch.float32
    return model.seen


BF16, FP32 = torch.bfloat16, torch.float32


@pytest.mark.parametrize(
    ("bf16_ops", "fp32_ops", "expected"),
    [
        (["linear", "truediv"], ["softmax"], {"linear": BF16, "softmax": FP32, "truediv": BF16}),
        ("softmax", "linear", {"linear": FP32, "softmax": BF16, "truediv": FP32}),
    ],
)
def test_listed_ops_run_in_their_lists_dtype(bf16_ops, fp32_ops, expected):
    options = {"use_torch_autocast": True, "autocast_bf16_ops": bf16_ops, "autocast_fp32_ops": fp32_ops}
    assert run(options) == expected
    # Declared as optimum-habana declares them: one op a line, in files the variables name.
    for var, ops in ((LOWER_PRECISION_LIST_ENV, bf16_ops), (FP32_LIST_ENV, fp32_ops)):
        assert Path(os.environ[var]).read_text().splitlines() == ([ops] if isinstance(ops, str) else ops)


def test_use_torch_autocast_autocasts_without_bf16():
    # mixed_precision "no", Habana's default lists (emulated by torch's CPU autocast): the linear layer in bf16.
    assert run({"use_torch_autocast": True})["linear"] == BF16


def test_the_lists_alone_do_not_autocast():
    lists = {"autocast_bf16_ops": "linear", "autocast_fp32_ops": "softmax"}
    assert run(lists) == {"linear": FP32, "softmax": FP32, "truediv": FP32}


def test_lists_the_bridge_has_read_cannot_change_in_the_process():
    first = {"use_torch_autocast": True, "autocast_bf16_ops": "linear", "autocast_fp32_ops": "softmax"}
    run(first)  # the emulated bridge reads the lists at its first autocast
    run(first)  # the same lists again: nothing to declare
    with pytest.raises(
        AdapterOptionsError, match=r"^autocast_bf16_ops / autocast_fp32_ops come too late: .*accel launch"
    ):
        fresh_accelerator({**first, "autocast_fp32_ops": "truediv"})


def test_one_list_alone_is_refused_and_names_must_be_op_names():
    with pytest.raises(AdapterOptionsError, match=r"replace Habana's two autocast lists together: give both"):
        GaudiOptions(autocast_bf16_ops="linear")
    with pytest.raises(AdapterOptionsError, match=r"autocast_fp32_ops: \['soft max'\] are not op names"):
        GaudiOptions(autocast_bf16_ops="linear", autocast_fp32_ops="soft max")


def test_launch_flags_declare_the_lists_for_the_workers(monkeypatch):
    monkeypatch.setenv("ACCEL_ADAPTER", "gaudi")
    args = ["--emulate", "--use-torch-autocast", "--autocast-bf16-ops", "linear,matmul", "--autocast-fp32-ops"]
    env = worker_env(_launch_parser().parse_args([*args, "softmax", "train.py"]))
    assert env["ACCEL_GAUDI_USE_TORCH_AUTOCAST"] == "1"
    assert GaudiOptions.from_env(env).autocast_op_lists == (("linear", "matmul"), ("softmax",))
    # The workers start with the files named (Habana's bridge reads them when it loads, before any adapter).
    assert Path(env[LOWER_PRECISION_LIST_ENV]).read_text() == "linear\nmatmul\n"
    assert Path(env[FP32_LIST_ENV]).read_text() == "softmax\n"


def test_use_torch_autocast_stays_off_under_deepspeed():
    # optimum-habana turns `use_torch_autocast` off under DeepSpeed, which manages precision itself.
    from accel.prepare.context import RunContext
    from accel.strategies.ddp import DDPStrategy
    from accel.strategies.deepspeed.strategy import DeepSpeedPlugin, DeepSpeedStrategy

    acc = fresh_accelerator({"use_torch_autocast": True})
    for strategy, dtype in ((DeepSpeedStrategy(DeepSpeedPlugin()), FP32), (DDPStrategy(), BF16)):
        ctx = RunContext(device=acc.device, strategy=strategy, adapter=acc.adapter, precision=acc.precision)
        model = acc.precision.convert_module(Probe(), ctx)
        model(torch.randn(3, 4))
        assert model.seen["linear"] == dtype, strategy.name
