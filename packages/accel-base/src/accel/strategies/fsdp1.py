"""FSDP1's pieces (torch's `FullyShardedDataParallel` wrapper), for `FSDPConfig(fsdp_version=1)`.

Accelerate's plugin defaults to FSDP1 and most existing Accelerate configs ask for it, so its options are
honoured as FSDP1 defines them (sharding strategies including NO_SHARD and hybrid sharding, backward and
forward prefetch, `limit_all_gathers`, `use_orig_params`, `sync_module_states`, `param_init_fn`, CPU offload,
FSDP1's `MixedPrecision`) instead of being mapped onto FSDP2. The strategy itself, `fsdp.FSDP1Strategy`, is
the `fsdp2` strategy's subclass (the registered name, the `DistributedType.FSDP` answer, the wrap policies and
the checkpoint format, which torch.distributed.checkpoint's state-dict API reads and writes for both, are
shared); this module holds what it needs that FSDP2 does not, and imports no other strategy module.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
BACKWARD_PREFETCH = ("BACKWARD_PRE", "BACKWARD_POST")

GROUPS_SPLIT_A_FLAT_PARAMETER = (
    "use_orig_params=False flattens each FSDP unit's parameters into one tensor, but this optimizer puts "
    "parameters of one unit ({unit!r}) in different parameter groups. Set use_orig_params=True (keeps the "
    "groups), or wrap so that each unit's parameters share one group."
)


def enum_name(value: Any, names: tuple[str, ...], what: str) -> str:
    """An FSDP1 enum given as its member, name or 1-based number (Accelerate's forms), as its name.

    Raises:
        ValueError: a value that names no member.
    """
    text = str(getattr(value, "name", value)).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(names):
        return names[int(text) - 1]
    if text not in names:
        raise ValueError(f"{what} must be one of {', '.join(names)} (or their numbers); got {value!r}.")
    return text


def normalise_fsdp1_options(config: Any) -> None:
    """Validate FSDP1's options in place, as Accelerate's plugin reads them under `fsdp_version=1`.

    `sharding_strategy` and `reshard_after_forward` both name the sharding strategy (the former wins, as in
    Accelerate); FSDP1 takes no bool there.

    Raises:
        ValueError: an unknown strategy or prefetch name, a bool `reshard_after_forward`, or
            `activation_checkpointing_offload` (Accelerate's message: it needs FSDP2).
    """
    given = config.sharding_strategy if config.sharding_strategy is not None else config.reshard_after_forward
    if isinstance(given, bool):
        raise ValueError(
            f"reshard_after_forward set to {given}. This is not supported with FSDP1, please set to a `str` or "
            "an instance of `torch.distributed.fsdp.fully_sharded_data_parallel.ShardingStrategy`"
        )
    config.sharding_strategy = enum_name(
        "FULL_SHARD" if given is None else given, SHARDING_STRATEGIES, "sharding_strategy"
    )
    config.reshard_after_forward = config.sharding_strategy
    prefetch = config.backward_prefetch
    if isinstance(prefetch, str) and prefetch.strip().upper() == "NO_PREFETCH":
        prefetch = None
    config.backward_prefetch = None if prefetch is None else enum_name(prefetch, BACKWARD_PREFETCH, "backward_prefetch")
    if config.activation_checkpointing_offload:
        raise ValueError("`activation_checkpointing_offload=True` requires `fsdp_version=2`.")
    config.forward_prefetch = bool(config.forward_prefetch)
    config.use_orig_params = bool(config.use_orig_params)
    config.sync_module_states = bool(config.sync_module_states) or config.cpu_ram_efficient_loading
    if not isinstance(config.cpu_offload, bool):
        config.cpu_offload = bool(getattr(config.cpu_offload, "offload_params", True))


def set_state_dict_type(fsdp: nn.Module, config: Any, device: torch.device) -> None:
    """What the wrapper's own `state_dict()` / `FSDP.optim_state_dict` give, as Accelerate sets it on FSDP1
    models: `state_dict_type` with the user's `state_dict_config` / `optim_state_dict_config`, else gathered to
    host memory (rank 0 only) for full state dicts. accel's `save_state` chooses its own options per call."""
    from torch.distributed.fsdp import (
        FullOptimStateDictConfig,
        FullStateDictConfig,
        ShardedOptimStateDictConfig,
        ShardedStateDictConfig,
        StateDictType,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    offload = device.type != "cpu"  # torch's host copy of host shards crashes (see fsdp_checkpoint._host_copy)
    full = config.state_dict_type == "FULL_STATE_DICT"
    model_config = config.state_dict_config or (
        FullStateDictConfig(offload_to_cpu=offload, rank0_only=offload) if full else ShardedStateDictConfig(offload)
    )
    optim_config = config.optim_state_dict_config or (
        FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=offload)
        if full
        else ShardedOptimStateDictConfig(offload)
    )
    FSDP.set_state_dict_type(fsdp, StateDictType[config.state_dict_type], model_config, optim_config)


def broadcast_from_main(model: nn.Module, device: torch.device) -> None:
    """`sync_module_states`: every rank starts from rank 0's parameters and buffers (broadcast before
    sharding; torch's own path refuses host-memory modules). A model built on the meta device is materialised
    first (`cpu_ram_efficient_loading`: rank 0's weights fill it)."""
    import torch.distributed as dist

    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        model.to_empty(device=device)
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)


def _flat_units(model: nn.Module) -> Iterator[tuple[str, Any, Any, list[str]]]:
    """Each FSDP1 unit of `model` with a flat parameter: (unit name, its handle, the flat parameter, the
    canonical names of the user's parameters it holds)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    from ..prepare.group import canonical_name

    for prefix, unit in model.named_modules():
        handle = getattr(unit, "_handle", None) if isinstance(unit, FSDP) else None
        flat = getattr(handle, "flat_param", None)
        if flat is not None:
            head = canonical_name(prefix + "." if prefix else "")
            yield canonical_name(prefix) or "<root>", handle, flat, [canonical_name(head + f) for f in flat._fqns]


def flat_group_names(optimizer: torch.optim.Optimizer, model: nn.Module) -> list[list[str]] | None:
    """The names of the user's parameters in each of `optimizer`'s groups when it trains FSDP1 flat parameters
    (use_orig_params=False: one flat parameter stands for several named ones); None when it trains none."""
    names = {
        id(flat): held for _, handle, flat, held in _flat_units(model) if not getattr(handle, "_use_orig_params", True)
    }
    if not names:
        return None
    return [[n for p in g["params"] for n in names.get(id(p), [])] for g in optimizer.param_groups]


def check_flat_optimizer_state(saved: Any, groups: list[list[str]], shapes: dict[str, Any], path: Any) -> None:
    """A full optimizer state dict (keyed by parameter name) fits an optimizer of FSDP1 flat parameters: the
    same names in each group, state shaped as the full parameters (`shapes`).

    Raises:
        CheckpointError: anything else, naming the file; nothing is loaded.
    """
    from ..errors import CheckpointError

    if not isinstance(saved, dict) or not isinstance(saved.get("param_groups"), list) or "state" not in saved:
        raise CheckpointError(f"Checkpoint file {path} is not an optimizer state dict. Nothing was loaded.")
    saved_groups = [list(g.get("params", [])) if isinstance(g, dict) else [] for g in saved["param_groups"]]
    if [sorted(map(str, g)) for g in saved_groups] != [sorted(g) for g in groups]:
        raise CheckpointError(
            f"Checkpoint file {path} does not fit the optimizer: its parameter groups hold "
            f"{[len(g) for g in saved_groups]} named parameters, the optimizer's flat parameters stand for "
            f"{[len(g) for g in groups]} (compare the model and the wrap policy). Nothing was loaded."
        )
    for name, state in saved["state"].items():
        shape = torch.Size(shapes.get(name, ()))
        for key, value in (state or {}).items():
            if isinstance(value, torch.Tensor) and value.dim() == len(shape) > 0 and value.shape != shape:
                raise CheckpointError(
                    f"Checkpoint file {path} does not fit the optimizer: state {key!r} of parameter {name} has "
                    f"shape {tuple(value.shape)}, the parameter {tuple(shape)}. Nothing was loaded."
                )


def flat_parameters_of(
    fsdp: nn.Module, before: dict[str, nn.Parameter]
) -> dict[int, tuple[weakref.ref[torch.Tensor], str]]:
    """Which flat parameter (and unit name) now holds each of the user's parameters `before` wrapping, by the
    parameter's id (use_orig_params=False)."""
    from ..prepare.group import canonical_name

    by_name = {canonical_name(n): p for n, p in before.items()}
    flat_of: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
    for unit_name, _, flat, held in _flat_units(fsdp):
        for name in held:
            old = by_name.get(name)
            if old is not None:
                flat_of[id(old)] = (weakref.ref(flat), unit_name)
    return flat_of


def repoint_to_flat(
    optimizer: torch.optim.Optimizer, flat_of: dict[int, tuple[weakref.ref[torch.Tensor], str]]
) -> None:
    """Make `optimizer` train the flat parameters that replaced its parameters (`flat_parameters_of`), each
    parameter group keeping its options.

    Raises:
        ValueError: one unit's parameters are split over several parameter groups.
        PrepareError: the optimizer already has state (it stepped before `prepare`).
    """
    from ..errors import PrepareError
    from ..prepare.group import STATE_ON_RESHAPED

    owner: dict[int, int] = {}
    plans = []
    for index, pg in enumerate(optimizer.param_groups):
        new: list[torch.Tensor] = []
        for p in pg["params"]:
            entry = flat_of.get(id(p))
            flat = entry[0]() if entry else None
            if flat is None or entry is None:
                new.append(p)
                continue
            if owner.setdefault(id(flat), index) != index:
                raise ValueError(GROUPS_SPLIT_A_FLAT_PARAMETER.format(unit=entry[1]))
            if not any(q is flat for q in new):
                new.append(flat)
        plans.append(new)
    if not owner:
        return
    if optimizer.state:
        raise PrepareError(STATE_ON_RESHAPED)
    for pg, params in zip(optimizer.param_groups, plans):
        pg["params"] = params


def sharded_grad_scaler(scaler: Any) -> Any:
    """fp16: torch's `ShardedGradScaler` with the adapter's scaler settings (each rank holds a shard of every
    flat gradient, so an inf in one shard must skip the step on every rank, as Accelerate's FSDP1 path does).

    Raises:
        ValueError: the adapter's scaler is a vendor class with no sharded counterpart.
    """
    if scaler is None:
        return None
    if type(scaler) is not torch.amp.GradScaler:
        raise ValueError(
            f"fp16 under fsdp_version=1 needs a grad scaler that skips a step on every rank at once; the "
            f"adapter's {type(scaler).__name__} has no sharded form. Use bf16, or fsdp_version=2."
        )
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(
        scaler._device,
        init_scale=scaler._init_scale,
        growth_factor=scaler._growth_factor,
        backoff_factor=scaler._backoff_factor,
        growth_interval=scaler._growth_interval,
        enabled=scaler.is_enabled(),
    )
