"""`accel estimate-memory`: memory per process for a model's parameters, gradients and optimizer state.

    accel estimate-memory mypkg.models:Net --num-processes 8 --optimizer adamw

The model is built on the meta device (no memory, no weights). `MODEL` is one of:

- `module:callable` returning an `nn.Module` (a class or a factory), `--kwargs` its JSON keyword arguments;
- a Hugging Face config: a local `config.json` or the folder holding it (what `accelerate estimate-memory`
  users have for a hub model: `huggingface-cli download NAME config.json`), built with transformers'
  `AutoModel.from_config`; `--kwargs` override its fields;
- a transformers model type (`gpt2`, `llama`, `bert`, ...): its default config, `--kwargs` for the fields
  (`{"n_layer": 48}`), built without downloading anything.

Figures are
exact byte counts of the tensors each strategy keeps on each process; activations, the
device allocator's caches and communication buffers come on top and depend on the
batch. Under FSDP2 and ZeRO-3 a process also holds one gathered unit at a time (the largest
is reported).
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import CliParser, UsageError

# Optimizer states kept per parameter element, in fp32 (Adam: exp_avg and exp_avg_sq).
OPTIMIZER_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1, "adagrad": 1, "rmsprop": 1}
STRATEGIES = ("ddp", "fsdp2", "zero1", "zero2", "zero3")


@dataclass(frozen=True)
class ModelSizes:
    """Byte counts of one model."""

    parameters: int
    """Number of parameter elements."""
    parameter_bytes: int
    """Bytes of the parameters in the dtype they are stored in for training."""
    largest_unit_bytes: int
    """Bytes of the largest child of a ModuleList (a transformer block), else of the largest
    leaf module: what FSDP2 and ZeRO-3 gather at once."""


def per_process_bytes(sizes: ModelSizes, strategy: str, num_processes: int, optimizer: str) -> dict[str, int]:
    """Bytes each process keeps for parameters, gradients and optimizer state under `strategy`.

    Gradients have the parameters' dtype; optimizer states are fp32. DDP keeps everything
    on every process; ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients, ZeRO-3
    and FSDP2 everything (plus one gathered unit at a time).
    """
    n = num_processes
    p = sizes.parameter_bytes
    g = p
    o = sizes.parameters * 4 * OPTIMIZER_STATES[optimizer]
    shard = {"ddp": (1, 1, 1), "zero1": (1, 1, n), "zero2": (1, n, n), "zero3": (n, n, n), "fsdp2": (n, n, n)}
    dp, dg, do = shard[strategy]
    out = {"parameters": -(-p // dp), "gradients": -(-g // dg), "optimizer": -(-o // do)}
    out["gathered unit"] = sizes.largest_unit_bytes if strategy in ("zero3", "fsdp2") and n > 1 else 0
    out["total"] = sum(out.values())
    return out


def model_sizes(model: Any) -> ModelSizes:
    """Parameter count, bytes and largest gathered unit of `model` (which may live on the meta device)."""
    import torch

    def nbytes(module: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in module.parameters())

    params = list(model.parameters())
    blocks = [child for m in model.modules() if isinstance(m, torch.nn.ModuleList) for child in m]
    units = blocks or [m for m in model.modules() if not list(m.children())]
    return ModelSizes(
        parameters=sum(p.numel() for p in params),
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        largest_unit_bytes=max((nbytes(u) for u in units), default=0),
    )


def build_on_meta(spec: str, kwargs: dict[str, Any], dtype: str) -> Any:
    """Import `module:callable`, call it on the meta device, cast to `dtype`.

    Raises:
        UsageError: the spec does not name an importable callable returning an nn.Module.
    """
    import torch

    module_name, _, attr = spec.partition(":")
    if ":" not in spec:
        return _build_transformers_on_meta(spec, kwargs).to(getattr(torch, dtype))
    if not module_name or not attr:
        raise UsageError(f"MODEL must be module:callable (e.g. mypkg.models:Net), got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot import {spec}: {exc}") from None
    with torch.device("meta"):
        model = factory(**kwargs)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(f"{spec} returned {type(model).__name__}, not a torch.nn.Module")
    return model.to(getattr(torch, dtype))


_FORMS = (
    "MODEL must be module:callable (e.g. mypkg.models:Net), a Hugging Face config.json (or its folder), or a "
    "transformers model type (gpt2, llama, ...)"
)


def _build_transformers_on_meta(spec: str, kwargs: dict[str, Any]) -> Any:
    """A transformers model from a local config (file or folder) or a model type, on the meta device.

    Raises:
        UsageError: transformers is missing, or `spec` is neither a local config nor a model type.
    """
    from pathlib import Path

    import torch

    path = Path(spec).expanduser()
    local = path.is_file() or (path.is_dir() and (path / "config.json").is_file())
    try:
        import transformers
    except ImportError:
        need = "reading a Hugging Face config" if local else _FORMS
        raise UsageError(f"{need} needs transformers: pip install transformers") from None
    from transformers import CONFIG_MAPPING, AutoConfig, AutoModel

    if local:
        try:
            config_dict, _ = transformers.PretrainedConfig.get_config_dict(str(path))
            model_type = config_dict.pop("model_type", None)
            if model_type not in CONFIG_MAPPING:
                raise UsageError(f"{path}: model_type {model_type!r} is not one transformers knows")
            config = CONFIG_MAPPING[model_type].from_dict({**config_dict, **kwargs})
        except UsageError:
            raise
        except Exception as exc:  # unreadable JSON, or fields transformers' validation refuses
            raise UsageError(f"{path} is not a usable Hugging Face config: {str(exc).splitlines()[0]}") from None
    elif spec in CONFIG_MAPPING:
        try:
            config = AutoConfig.for_model(spec, **kwargs)
        except Exception as exc:  # transformers validates fields with its own error classes
            raise UsageError(f"--kwargs for a {spec} config: {str(exc).splitlines()[0]}") from None
    else:
        raise UsageError(
            f"{_FORMS}, got {spec!r}; for a hub model, download its config "
            f"(`huggingface-cli download {spec} config.json`) and pass that file"
        )
    with torch.device("meta"):
        try:
            return AutoModel.from_config(config)
        except (TypeError, ValueError) as exc:  # no base model class for the type, or a field it cannot take
            raise UsageError(f"transformers cannot build a model from this {config.model_type} config: {exc}") from None


def parser() -> argparse.ArgumentParser:
    """The `accel estimate-memory` parser."""
    p = CliParser(prog="accel estimate-memory", description="Memory per process under DDP, FSDP2 and ZeRO 1/2/3.")
    p.add_argument(
        "model",
        help="module:callable returning the nn.Module, a Hugging Face config.json (or its folder), or a "
        "transformers model type (gpt2, llama, ...); built on the meta device",
    )
    p.add_argument("--kwargs", default="{}", help="JSON keyword arguments for the callable, or config fields")
    p.add_argument(
        "--num-processes",
        "--num_processes",
        dest="num_processes",
        type=int,
        default=8,
        help="processes sharing the model",
    )
    p.add_argument(
        "--optimizer", choices=sorted(OPTIMIZER_STATES), default="adamw", help="sets the fp32 states per parameter"
    )
    p.add_argument(
        "--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="parameter dtype in training"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def estimate_memory_command(argv: Sequence[str]) -> int:
    """Run `accel estimate-memory ARGV`."""
    ns = parser().parse_args(list(argv))
    if ns.num_processes < 1:
        raise UsageError(f"--num-processes must be at least 1, got {ns.num_processes}")
    try:
        kwargs = json.loads(ns.kwargs)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--kwargs is not JSON: {exc}") from None
    sizes = model_sizes(build_on_meta(ns.model, kwargs, ns.dtype))
    rows = {s: per_process_bytes(sizes, s, ns.num_processes, ns.optimizer) for s in STRATEGIES}
    if ns.json:
        print(json.dumps({"parameters": sizes.parameters, "per_process_bytes": rows}, indent=1))
        return 0
    print(
        f"{ns.model}: {sizes.parameters:,} parameters, {_human(sizes.parameter_bytes)} in {ns.dtype}; "
        f"{ns.optimizer}; {ns.num_processes} processes. Per process, before activations:"
    )
    columns = ["parameters", "gradients", "optimizer", "gathered unit", "total"]
    print(f"  {'strategy':<9}" + "".join(f"{c:>15}" for c in columns))
    for strategy, row in rows.items():
        print(f"  {strategy:<9}" + "".join(f"{_human(row[c]):>15}" for c in columns))
    return 0
