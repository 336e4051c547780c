"""xla_fsdp_v2 per layer on torch_xla's CPU device with several SPMD devices (CPU_NUM_DEVICES), against the same
loop in plain torch on the CPU; then an SPMD distributed checkpoint's exact resume and a damaged one refused.

Runs through `notebook_launcher(main, num_processes=1)`, a TPU notebook's way under SPMD. Prints one JSON line.
argv: OUT_DIR. The strategy comes from ACCEL_STRATEGY (turned on before the runtime starts),
its settings from ACCEL_STRATEGY_CONFIG.
"""

import copy
import json
import sys
from pathlib import Path

import torch
import torch_xla
from accel import Accelerator
from accel.errors import CheckpointError
from accel.state import AcceleratorState, GradientState
from accel_xla import xla
from torch.utils.data import DataLoader, TensorDataset


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + torch.tanh(self.fc(h))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 16)
        self.layers = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 4, generator=g)
    return TensorDataset(x, torch.sin(x) + 0.1)


def step(accelerator: Accelerator | None, model: torch.nn.Module, opt: torch.optim.Optimizer, xb, yb) -> float:
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    if accelerator is None:
        loss.backward()
    else:
        accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
    return float(loss.item())


def host(model: torch.nn.Module, accelerator: Accelerator) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu") for k, v in accelerator.get_state_dict(model).items()}


def prepared(reference: torch.nn.Module) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer, DataLoader]:
    accelerator = Accelerator()
    model = copy.deepcopy(reference)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = accelerator.prepare(model, opt, DataLoader(data(), batch_size=8))
    return accelerator, model, opt, loader


def second_pair(accelerator: Accelerator) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A second model with its own optimizer (momentum state), so the checkpoint holds two of each."""
    aux = Net()  # its Block layers are units too (a model without them would be refused: tested below)
    return accelerator.prepare(aux, torch.optim.SGD(aux.parameters(), lr=0.1, momentum=0.9))


def main() -> None:
    out = Path(sys.argv[1])
    torch.manual_seed(0)
    reference = Net()
    accelerator, model, opt, loader = prepared(reference)
    plain = copy.deepcopy(reference)
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)

    inner = accelerator.unwrap_model(model)
    units = [n for n, m in inner.named_modules() if xla.is_fsdp_v2(m)]
    params = list(model.parameters())
    whole = sum(p.numel() * p.element_size() for p in params)
    held = xla.local_shard_bytes(params)

    losses, expected, batch_specs = [], [], []
    batches = list(DataLoader(data(), batch_size=8))
    for i, (xb, yb) in enumerate(loader):
        if i < 4:
            batch_specs.append(xla.sharding_spec(xb))
            losses.append(step(accelerator, model, opt, xb, yb))
            expected.append(step(None, plain, plain_opt, *batches[i]))
    output_spec = xla.sharding_spec(model(batches[0][0].to(accelerator.device)))
    weights = host(model, accelerator)
    weights_diff = max((weights[k] - v).abs().max().item() for k, v in plain.state_dict().items())

    # An SPMD distributed checkpoint, then two more steps: the run to resume exactly.
    aux, aux_opt = second_pair(accelerator)
    step(accelerator, aux, aux_opt, *(t.to(accelerator.device) for t in batches[0]))
    ckpt = out / "ckpt"
    accelerator.save_state(ckpt)
    files = sorted(p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file())
    rest = batches[4:6]
    for xb, yb in rest:
        step(accelerator, model, opt, xb.to(accelerator.device), yb.to(accelerator.device))
        step(accelerator, aux, aux_opt, xb.to(accelerator.device), yb.to(accelerator.device))
    uninterrupted = host(model, accelerator) | {f"aux.{k}": v for k, v in host(aux, accelerator).items()}
    specs_before = [xla.sharding_spec(p) for p in model.parameters()]

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    torch.manual_seed(1)
    accelerator, model, opt, loader = prepared(Net())
    aux, aux_opt = second_pair(accelerator)
    fresh = host(model, accelerator)
    # A damaged shard: refused by its hash, nothing changed.
    damaged = out / "damaged"
    import shutil

    shutil.copytree(ckpt, damaged)
    shard = next(p for p in sorted((damaged / "pytorch_model_fsdp_0").iterdir()) if p.name.endswith(".distcp"))
    shard.write_bytes(shard.read_bytes()[:-8] + b"\0" * 8)
    try:
        accelerator.load_state(damaged)
        refused = ""
    except CheckpointError as exc:
        refused = str(exc)
    unchanged = all(torch.equal(v, fresh[k]) for k, v in host(model, accelerator).items())

    accelerator.load_state(ckpt)
    specs_after = [xla.sharding_spec(p) for p in model.parameters()]
    for xb, yb in rest:
        step(accelerator, model, opt, xb.to(accelerator.device), yb.to(accelerator.device))
        step(accelerator, aux, aux_opt, xb.to(accelerator.device), yb.to(accelerator.device))
    resumed = host(model, accelerator) | {f"aux.{k}": v for k, v in host(aux, accelerator).items()}
    accelerator.save_model(model, out / "export")
    from safetensors.torch import load_file

    exported = load_file(str(out / "export" / "model.safetensors"))

    # Settings that cannot work, refused at prepare.
    refusals = {}
    for name, config in {
        "missing_class": {"transformer_layer_cls_to_wrap": ["Missing"]},
        "checkpointing_without_units": {"gradient_checkpointing": True},
    }.items():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        try:
            Accelerator(strategy_config=config).prepare(Net())
            refusals[name] = ""
        except ValueError as exc:
            refusals[name] = str(exc)

    print(
        json.dumps(
            {
                "devices": len(held),
                "mesh": xla.mesh_shape(),
                "units": units,
                "checkpointed": [
                    n for n, m in inner.named_modules() if hasattr(m, "_xla_checkpointed_forward_original")
                ],
                "param_specs": specs_before,
                "whole_bytes": whole,
                "held_bytes": held,
                "batch_specs": batch_specs,
                "output_spec": output_spec,
                "losses": losses,
                "expected": expected,
                "weights_diff": weights_diff,
                "names": sorted(weights) == sorted(reference.state_dict()),
                "files": files,
                "refused": refused,
                "unchanged_after_refusal": unchanged,
                "specs_kept": specs_after == specs_before,
                "resumed_bitwise": sorted(resumed) == sorted(uninterrupted)
                and all(torch.equal(resumed[k], v) for k, v in uninterrupted.items()),
                "exported_bitwise": all(torch.equal(exported[k], resumed[k]) for k in exported),
                "refusals": refusals,
                "xla_version": torch_xla.__version__,
            }
        )
    )


if __name__ == "__main__":
    # As from a TPU notebook: one process drives every device of the host under SPMD.
    from accel import notebook_launcher

    notebook_launcher(main, num_processes=1)
