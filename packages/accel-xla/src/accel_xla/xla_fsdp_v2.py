"""xla_fsdp_v2: torch_xla's SPMD fully sharded data parallelism (FSDPv2) as a strategy.

`Accelerator(strategy="xla_fsdp_v2")` on the xla adapter wraps each prepared model in torch_xla's
`SpmdFullyShardedDataParallel`, as transformers does for `fsdp_config={"xla": True, "xla_fsdp_v2": True}`:
SPMD is turned on, every device of the host is one virtual device, and each parameter is sharded along
the "fsdp" axis of the global mesh (a mesh of every device, axes ("fsdp", "model"), unless the script
set one with `torch_xla.distributed.spmd.set_global_mesh`). With `XLAFSDPv2Config`:

- per-layer units: the layers of `transformer_layer_cls_to_wrap` (default: the model's
  `_no_split_modules`, as transformers), or every subtree of `min_num_params` parameters, or a
  torch_xla `auto_wrap_policy`, each become a unit of their own;
- `shard_output`: each unit's output is sharded along the batch dimension (the first tensor of a
  tuple, `logits` of a mapping; or the user's callable);
- batches from prepared loaders are split along their first dimension over the "fsdp" axis
  (`MpDeviceLoader(input_sharding=...)`): each device computes its part of the global batch;
- `gradient_checkpointing`: each unit's forward is recomputed in backward (`torch_xla.utils.checkpoint`).

XLA's SPMD partitioner inserts the all-gathers and reduce-scatters; the optimizer step is a plain step.
`save_state` writes each model and optimizer as an SPMD distributed checkpoint (torch.distributed.checkpoint
with torch_xla's SPMD planners: each device's shards written from the host, never gathered whole), committed
and hashed as every accel checkpoint is.

SPMD runs one process per host: launch one process (`accel launch --num-processes 1`, or plain
`python`) per TPU VM. Several processes on one host are refused. torch_xla is reached only
through the adapter's vendor module; under emulation (no torch_xla) the strategy is refused.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.errors import StrategyNotSupportedError
from accel.strategies.base import Strategy

if TYPE_CHECKING:
    from accel.prepare.context import RunContext
    from accel.prepare.prepared import Prepared


SPMD_TOO_LATE = (
    "The xla_fsdp_v2 strategy needs torch_xla's SPMD mode on before the XLA runtime starts, and it has started "
    "without it. Select the strategy before the Accelerator exists: `accel launch --strategy xla_fsdp_v2`, "
    "ACCEL_STRATEGY=xla_fsdp_v2, or `torch_xla.runtime.use_spmd()` at the top of the script."
)

# The segment torch_xla's wrapper puts into the state-dict names of the units it wraps.
_UNIT_SEGMENT = "_orig_module"


@dataclasses.dataclass(kw_only=True)
class XLAFSDPv2Config:
    """Settings of the `xla_fsdp_v2` strategy (`Accelerator(strategy_config=XLAFSDPv2Config(...))`, a dict of the
    same keys, or a config file's `strategy_config:`). transformers' `fsdp_config` key `xla_fsdp_grad_ckpt` is
    accepted for `gradient_checkpointing`."""

    transformer_layer_cls_to_wrap: list[str | type] | str | type | None = None
    """Layer classes (or their names) whose instances each become a unit of their own. None: the model's
    `_no_split_modules` when it has them (as transformers), else none."""
    min_num_params: int = 0
    """With no layer classes: every subtree of at least this many parameters becomes a unit (0: off)."""
    auto_wrap_policy: Callable[..., bool] | None = None
    """A torch_xla auto-wrap policy `(module, recurse, unwrapped_params) -> bool`; replaces the two above."""
    shard_output: Callable[[Any, Any], None] | None = None
    """`(output, mesh) -> None`, marking the sharding of each unit's output. None: the first tensor of the output
    (a tuple's first, a mapping's `logits` or first tensor) sharded along dimension 0 over "fsdp"."""
    gradient_checkpointing: bool = False
    """Recompute each unit's forward in backward (needs units: layer classes, `min_num_params` or a policy)."""
    shard_inputs: bool = True
    """Split every batch of a prepared loader along dimension 0 over the "fsdp" axis."""
    xla_fsdp_grad_ckpt: dataclasses.InitVar[bool | None] = None
    """transformers' name for `gradient_checkpointing` (accepted, so its `fsdp_config` keys carry over)."""

    def __post_init__(self, xla_fsdp_grad_ckpt: bool | None) -> None:
        if xla_fsdp_grad_ckpt is not None:
            self.gradient_checkpointing = bool(xla_fsdp_grad_ckpt)
        if isinstance(self.transformer_layer_cls_to_wrap, (str, type)):
            self.transformer_layer_cls_to_wrap = [self.transformer_layer_cls_to_wrap]
        if not isinstance(self.min_num_params, int) or self.min_num_params < 0:
            raise ValueError(f"XLAFSDPv2Config.min_num_params must be an int >= 0, got {self.min_num_params!r}.")
        for name in ("auto_wrap_policy", "shard_output"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"XLAFSDPv2Config.{name} must be callable, got {getattr(self, name)!r}.")

    @classmethod
    def from_any(cls, config: Any) -> XLAFSDPv2Config:
        """`config` as given to the strategy: None, this class, or a dict of its fields.

        Raises:
            ValueError: an unknown key, or another type.
        """
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if isinstance(config, Mapping):
            kwargs = dict(config)
            known = {f.name for f in dataclasses.fields(cls)} | {"xla_fsdp_grad_ckpt"}
            unknown = sorted(str(k) for k in kwargs if k not in known)
            if unknown:
                raise ValueError(f"The xla_fsdp_v2 strategy does not take {unknown}; its settings are {sorted(known)}.")
            return cls(**kwargs)
        raise ValueError(
            f"The xla_fsdp_v2 strategy's config is an XLAFSDPv2Config or a dict of its fields, got {type(config).__name__}."
        )


def _emulated() -> bool:
    from accel.state import PartialState

    state = PartialState._shared_state
    adapter = state.get("adapter") if isinstance(state, dict) else None
    return bool(getattr(adapter, "emulate", False))


def clean_name(name: str) -> str:
    """A state-dict name without the segments torch_xla's unit wrappers insert (the user's module's name)."""
    return ".".join(s for s in name.split(".") if s != _UNIT_SEGMENT)


def first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor a model's output is sharded by: the output itself, a tuple's or list's first tensor, a
    mapping's (transformers' ModelOutput) `logits`, else its first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, Mapping):
        if isinstance(output.get("logits"), torch.Tensor):
            return output["logits"]  # type: ignore[no-any-return]
        output = list(output.values())
    if isinstance(output, (tuple, list)):
        return next((t for t in output if isinstance(t, torch.Tensor)), None)
    return None


class XLAFSDPv2Strategy(Strategy):
    """Parameters sharded over the host's XLA devices by torch_xla's SPMD partitioner (FSDPv2)."""

    name: ClassVar[str] = "xla_fsdp_v2"
    config_class: ClassVar[type[Any] | None] = XLAFSDPv2Config

    def __init__(self, config: Any = None) -> None:
        """`config`: an `XLAFSDPv2Config`, a dict of its fields, or None (whole model one unit, unless it names
        `_no_split_modules`).

        Raises:
            ValueError: bad settings, or SPMD can no longer be turned on (the runtime started without it).
        """
        super().__init__(XLAFSDPv2Config.from_any(config))
        self._vendor: Any = None
        # SPMD must be on before torch_xla's runtime starts (a step after a late switch crashed
        # torch_xla 2.9): the xla adapter turns it on before its first device lookup when
        # ACCEL_STRATEGY names this strategy; otherwise it is checked here (emulation has no
        # torch_xla: `wrap_model` refuses there).
        if not _emulated():
            try:
                from . import xla
            except ImportError:
                return
            mode = xla.spmd_mode()
            if mode == "free":
                xla.use_spmd()
            elif mode == "too late":
                raise ValueError(SPMD_TOO_LATE)

    def _policy(self, model: torch.nn.Module, vendor: Any) -> Any:
        config: XLAFSDPv2Config = self.config
        if config.auto_wrap_policy is not None:
            return config.auto_wrap_policy
        wanted = config.transformer_layer_cls_to_wrap
        if wanted is None:
            wanted = list(getattr(model, "_no_split_modules", None) or []) or None
        policies = vendor.wrap_policies()
        if wanted:
            present = {type(m) for m in model.modules()}
            classes = set()
            for item in wanted:  # type: ignore[union-attr]
                found = [c for c in present if c is item or c.__name__ == item]
                if not found:
                    raise ValueError(
                        f"Could not find the transformer layer class {getattr(item, '__name__', item)!r} in the model "
                        "(xla_fsdp_v2's transformer_layer_cls_to_wrap). Name a class the model contains."
                    )
                classes.update(found)
            return functools.partial(policies["transformer"], transformer_layer_cls=classes)
        if config.min_num_params > 0:
            return functools.partial(policies["size"], min_num_params=config.min_num_params)
        return None

    def wrap_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """The model in torch_xla's `SpmdFullyShardedDataParallel` over the global mesh, per layer as configured.

        Raises:
            ValueError: not the xla adapter on torch_xla (emulation has no SPMD partitioner), several
                processes on this host (SPMD drives every local device from one process), a layer class the
                model does not contain, or gradient checkpointing without units to checkpoint.
        """
        vendor = ctx.adapter_defaults.get("vendor")
        if vendor is None:
            raise ValueError(
                "The xla_fsdp_v2 strategy runs on the xla adapter only (it reaches torch_xla through the adapter's "
                "vendor module). Use `adapter='xla'` on a TPU VM or with PJRT_DEVICE=CPU."
            )
        if ctx.use_distributed:
            raise ValueError(
                f"The xla_fsdp_v2 strategy (torch_xla SPMD) drives every device of a host from one process, but "
                f"{ctx.num_processes} processes were launched. Launch one process per host (`--num-processes 1`)."
            )
        self._vendor = vendor
        # Emulation's stand-in refuses here: it has no SPMD partitioner.
        vendor.global_mesh()
        policy = self._policy(model, vendor)
        if self.config.gradient_checkpointing and policy is None:
            raise ValueError(
                "xla_fsdp_v2's gradient_checkpointing recomputes each wrapped layer, and no layer is wrapped: set "
                "transformer_layer_cls_to_wrap (or min_num_params, or auto_wrap_policy) too."
            )
        shard_output = self.config.shard_output or functools.partial(_shard_first_tensor, vendor)
        vendor.shard_batches(self.config.shard_inputs)  # read by the adapter's device loader
        return vendor.fsdp_v2_wrap(  # type: ignore[no-any-return]
            model,
            auto_wrap_policy=policy,
            shard_output=shard_output,
            gradient_checkpointing=self.config.gradient_checkpointing,
        )

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside the root unit (its per-layer units stay wrapped, as under FSDP1)."""
        if self._vendor is not None and self._vendor.is_fsdp_v2(model):
            inner: torch.nn.Module = model.module  # type: ignore[assignment]
            return inner
        return model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        return self._vendor is not None and bool(self._vendor.is_fsdp_v2(model))

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The user's module's state dict under its own names (the per-layer units' segments left out)."""
        return {clean_name(k): v for k, v in self.unwrap(model).state_dict().items()}

    def load_full_state_dict(
        self, model: torch.nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True
    ) -> None:
        module = self.unwrap(model)
        live = {clean_name(k): k for k in module.state_dict()}
        module.load_state_dict({live.get(k, k): v for k, v in state_dict.items()}, strict=strict)

    # ---- SPMD distributed checkpoints -------------------------------------------------------------------
    def save_checkpoint_state(
        self, prepared: Prepared, ctx: RunContext, directory: Path, *, writer: bool, safe_serialization: bool
    ) -> list[str] | None:
        """Each model into `pytorch_model_fsdp_<i>/` and each optimizer into `optimizer_<i>/` (Accelerate's sharded
        names), as torch.distributed.checkpoint folders written by torch_xla's SPMD save planner: every device's
        shards go to disk from the host, no parameter is gathered whole. Optimizer state is keyed by parameter
        name (torch's sharded layout)."""
        if self._vendor is None:
            return None
        from accel.checkpoint.dcp import model_folder, optimizer_folder

        files = []
        for i, model in enumerate(prepared.models):
            self._vendor.save_sharded({"model": self.full_state_dict(_strip(model))}, directory / model_folder(i))
            files.append(model_folder(i))
        for i, opt in enumerate(prepared.optimizers):
            inner = getattr(opt, "optimizer", opt)
            names = self._names(inner, prepared)
            self._vendor.save_sharded(
                {"optimizer": _by_name(inner.state_dict(), names)}, directory / optimizer_folder(i)
            )
            files.append(optimizer_folder(i))
        return files

    def load_checkpoint_state(self, prepared: Prepared, ctx: RunContext, directory: Path, *, strict: bool) -> bool:
        """Restore what `save_checkpoint_state` wrote, all or nothing: every folder is read into new tensors
        sharded like the live ones (each device reads its own shards) and checked against the live models and
        optimizers; only then are the parameters, buffers and optimizer states replaced.

        Raises:
            accel.errors.CheckpointError: a folder missing (a checkpoint of another strategy), damaged, or not
                fitting the model or optimizer, naming it. Nothing was changed.
        """
        from accel.checkpoint.dcp import model_folder, optimizer_folder
        from accel.checkpoint.optimizer_keys import rekey
        from accel.checkpoint.validate import check_model_state, check_optimizer_state

        vendor = self._vendor
        models = []
        for i, model in enumerate(prepared.models):
            folder = _folder(directory, model_folder(i))
            live = {clean_name(k): v for k, v in self.unwrap(_strip(model)).state_dict(keep_vars=True).items()}
            saved = _saved_tree(folder, functools.partial(_model_donor, live), vendor)
            check_model_state(live, saved.get("model", {}), folder, strict=strict)
            wanted = {k: v for k, v in saved.get("model", {}).items() if k in live}
            vendor.load_sharded({"model": wanted}, folder)
            models.append((live, wanted))
        optimizers = []
        for i, opt in enumerate(prepared.optimizers):
            inner = getattr(opt, "optimizer", opt)
            names = self._names(inner, prepared)
            folder = _folder(directory, optimizer_folder(i))
            params = dict(zip(names, _params(inner))) if names is not None else {}

            def donor(path: tuple[Any, ...], params: dict[str, Any] = params) -> Any:
                return params.get(path[2]) if len(path) == 4 and path[1] == "state" else None

            tree = _saved_tree(folder, donor, vendor)
            vendor.load_sharded(tree, folder)
            state = rekey(_positions(tree.get("optimizer")), inner, names, by_name=False, path=folder)
            check_optimizer_state(inner, state, folder)
            optimizers.append((inner, state))
        # Everything read and checked: now apply.
        with torch.no_grad():
            for live, loaded in models:
                for key, value in loaded.items():
                    live[key].copy_(value)
        for inner, state in optimizers:
            inner.load_state_dict(state)
        vendor.sync()
        return True

    def _names(self, optimizer: torch.optim.Optimizer, prepared: Prepared) -> list[str] | None:
        """The name of each parameter `optimizer` updates, in torch's order, in its prepared model (the units'
        segments left out); None when one belongs to no prepared model or two share a name."""
        by_id: dict[int, str] = {}
        for model in prepared.models:
            for name, param in self.unwrap(_strip(model)).named_parameters():
                by_id.setdefault(id(param), clean_name(name))
        found = [by_id.get(id(p)) for p in _params(optimizer)]
        if any(n is None for n in found) or len(set(found)) != len(found):
            return None
        return [n for n in found if n is not None]


def _model_donor(live: dict[str, torch.Tensor], path: tuple[Any, ...]) -> torch.Tensor | None:
    """The live tensor a model folder's item at `path` ("model", name) is read like."""
    return live.get(path[1]) if len(path) == 2 else None


def _shard_first_tensor(vendor: Any, output: Any, mesh: Any) -> None:
    tensor = first_tensor(output)
    if tensor is None:
        raise ValueError(
            f"xla_fsdp_v2 shards each unit's output along the batch dimension and found no tensor in a "
            f"{type(output).__name__} output. Pass shard_output=callable(output, mesh) in the strategy's config."
        )
    vendor.mark_batch_sharding(tensor, mesh)


def _strip(model: torch.nn.Module) -> torch.nn.Module:
    from accel.prepare.wrappers import strip_compile

    return strip_compile(model)


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _by_name(state: dict[str, Any], names: list[str] | None) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter name (positions where names are unknown)."""
    if names is None:
        return state
    return {
        "state": {names[k]: v for k, v in state["state"].items()},
        "param_groups": [{**g, "params": [names[p] for p in g["params"]]} for g in state["param_groups"]],
    }


def _positions(saved: Any) -> Any:
    """A saved optimizer state with its positional keys as numbers again (the checkpoint's paths name them as
    text); names are left as they are."""
    if isinstance(saved, dict) and isinstance(saved.get("state"), dict):
        saved["state"] = {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in saved["state"].items()}
    return saved


def _folder(directory: Path, name: str) -> Path:
    from accel.errors import CheckpointError

    folder = directory / name
    if not (folder / ".metadata").is_file():
        raise CheckpointError(
            f"{folder} is missing: the checkpoint at {directory} was not written by the xla_fsdp_v2 strategy (or not "
            "with these models and optimizers). Nothing was loaded. Load it with the strategy that saved it."
        )
    return folder


def _saved_tree(folder: Path, donor: Callable[[tuple[Any, ...]], Any], vendor: Any) -> dict[str, Any]:
    """The nested state a folder holds, as empty tensors to read into (sharded like `donor(path)`, the live tensor
    at that path, where there is one) and None for the other items (filled in by the read)."""
    from accel.checkpoint.dcp import _place, safe_reader  # the core's reader of sharded folders, and its tree builder
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = safe_reader(folder).read_metadata()
    tree: dict[str, Any] = {}
    for key, item in metadata.state_dict_metadata.items():
        path = tuple((metadata.planner_data or {}).get(key, (key,)))
        value = None
        if isinstance(item, TensorStorageMetadata):
            value = vendor.empty_like_sharded(tuple(item.size), item.properties.dtype, donor(path))
        _place(tree, path, value)
    return tree


class XLAFSDPv1Strategy(Strategy):
    """`strategy="xla_fsdp"` (torch_xla's FSDPv1, `XlaFullyShardedDataParallel`): refused with the reason."""

    name: ClassVar[str] = "xla_fsdp"

    def __init__(self, config: Any = None) -> None:
        """Raises:
        StrategyNotSupportedError: always; the message says why and what to use instead."""
        raise StrategyNotSupportedError(
            "torch_xla's FSDPv1 (XlaFullyShardedDataParallel, transformers' fsdp_config={'xla': True}) is not offered "
            "by accel-xla: it runs one process per chip and reduce-scatters between them, which torch_xla's CPU "
            "device cannot run (each process is a world of one), so it could not be tested; torch_xla recommends "
            "FSDPv2 on SPMD instead. Use strategy='xla_fsdp_v2': the same per-layer wrapping "
            "(transformer_layer_cls_to_wrap, min_num_params, gradient_checkpointing), one process per host."
        )
