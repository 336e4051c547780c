"""FSDP2: torch-native fully sharded data parallelism (`torch.distributed.fsdp.fully_shard`).

Each process keeps a shard of every parameter, gradient and optimizer state; a wrapped
unit gathers its parameters for its forward and backward and frees them afterwards.
Checkpointing lives in `fsdp_checkpoint.py`.
"""

from __future__ import annotations

import contextlib
import functools
import re
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from . import fsdp1
from .base import Strategy

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..distributed.distributed_type import DistributedType
    from ..prepare.context import RunContext
    from ..prepare.group import PrepareGroup
    from ..prepare.prepared import Prepared
    from .parallelism_config import MeshFacts, ParallelismConfig

STATE_DICT_TYPES = ("FULL_STATE_DICT", "SHARDED_STATE_DICT")
_SHARDING_BY_NUMBER = {
    "1": "FULL_SHARD",
    "2": "SHARD_GRAD_OP",
    "3": "NO_SHARD",
    "4": "HYBRID_SHARD",
    "5": "_HYBRID_SHARD_ZERO2",
}
WRAP_POLICIES = ("transformer_based_wrap", "size_based_wrap", "no_wrap")
_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Prefix that activation checkpointing inserts into parameter names.

MODEL_WITHOUT_OPTIMIZER = (
    "When using FSDP2, a model and optimizer must be passed together to `Accelerator.prepare()` as the "
    "optimizer needs to have its parameters modified after the model is converted."
)


@dataclass(kw_only=True)
class FSDPConfig:
    """How FSDP2 shards a model. Pass it as `Accelerator(fsdp_plugin=FSDPConfig(...))`.

    Also exported as `accel.FullyShardedDataParallelPlugin`, Accelerate's name.
    """

    fsdp_version: int = 2
    """2: `fully_shard` (FSDP2, the default). 1: torch's `FullyShardedDataParallel` wrapper (FSDP1, Accelerate's
    default and deprecated upstream), with its own options below honoured as FSDP1 defines them."""
    auto_wrap_policy: str | Callable[[nn.Module], bool] | None = None
    """Which submodules become their own FSDP unit (gathered and freed on their own).
    None: each child of an `nn.ModuleList` (transformer blocks), or size-based when
    `min_num_params` is set; "transformer_based_wrap": modules named in
    `transformer_cls_names_to_wrap`; "size_based_wrap": subtrees holding at least
    `min_num_params` parameters; "no_wrap": one unit for the whole model (peak memory
    of the full model); or a callable `module -> bool`. The root is always a unit."""
    transformer_cls_names_to_wrap: Sequence[str | type[nn.Module]] | None = None
    """Module classes (or class names, or one string of comma-separated names such as
    "LlamaDecoderLayer,LlamaMLP", as Accelerate takes them) wrapped by "transformer_based_wrap";
    default: the model's `_no_split_modules`."""
    min_num_params: int | None = 0
    """Parameter count at which "size_based_wrap" makes a subtree its own unit. Smaller
    units mean lower peak memory and more, smaller collectives."""
    reshard_after_forward: bool | str | None = None
    """Free the gathered parameters after forward; costs a second all-gather in backward.
    False keeps them until backward (more memory, less communication). None: True under FSDP2;
    under FSDP1 a sharding strategy's name (as `sharding_strategy`), default "FULL_SHARD"."""
    mixed_precision_policy: Any = None
    """A `torch.distributed.fsdp.MixedPrecisionPolicy`, or a dict of its fields (dtypes may
    be names like "bfloat16"). None: from the Accelerator's `mixed_precision` (bf16 ->
    bf16 parameters with fp32 gradient reduction)."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in CPU memory and step the
    optimizer there: frees device memory at the cost of host-device copies every step."""
    pin_memory: bool | None = None
    """Pin the offloaded memory for faster copies. None: pin unless the device is the CPU
    (pinning needs an accelerator)."""
    state_dict_type: str = "FULL_STATE_DICT"
    """How `save_state` writes models and optimizers. "FULL_STATE_DICT": gathered on the main
    process into safetensors (portable, loads into any world size; the full model must fit
    in host memory). "SHARDED_STATE_DICT": each process writes its shard through
    torch.distributed.checkpoint (fast and memory-flat)."""
    activation_checkpointing: bool = False
    """Recompute the activations of each wrapped unit in backward instead of storing them:
    less memory for roughly one extra forward."""
    extra_kwargs: dict[str, Any] = field(default_factory=dict)
    """Passed through to every `fully_shard` call (e.g. `shard_placement_fn`)."""
    sharding_strategy: Any = None
    """FSDP1: "FULL_SHARD" (default), "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD" or "_HYBRID_SHARD_ZERO2"
    (shard within a node, replicate across nodes), as names, numbers or torch's enum; `reshard_after_forward`
    may carry the same name. Under FSDP2: "FULL_SHARD" means `reshard_after_forward=True`, "SHARD_GRAD_OP"
    `False`; "NO_SHARD" (the ddp strategy) and hybrid sharding (`ParallelismConfig(dp_replicate_size=...,
    dp_shard_size=...)`) are refused, saying so."""
    backward_prefetch: Any = None
    """FSDP1: "BACKWARD_PRE", "BACKWARD_POST" or None. Under FSDP2 (which always prefetches the next unit in
    backward) ignored with Accelerate's warning."""
    forward_prefetch: Any = None
    """FSDP1: prefetch the next unit's all-gather in forward. Refused under FSDP2, as Accelerate does."""
    ignored_modules: Any = None
    """Modules (or a regex of module names) whose parameters FSDP2 leaves unsharded (`ignored_params`)."""
    state_dict_config: Any = None
    """FSDP1: torch's `FullStateDictConfig` / `ShardedStateDictConfig` for the wrapper's own `state_dict()`
    (`save_state` picks its own; `state_dict_type` decides what it writes). Under FSDP2 ignored with a warning."""
    optim_state_dict_config: Any = None
    """FSDP1: as `state_dict_config`, for `FSDP.optim_state_dict`."""
    limit_all_gathers: bool = True
    """FSDP1: rate-limit in-flight all-gathers (FSDP2 always does)."""
    use_orig_params: bool | None = None
    """FSDP1: False (default) flattens each unit's parameters into one tensor the optimizer trains (each
    optimizer group must hold whole units); True keeps the original parameters. FSDP2 always trains the
    original parameters (ignored with Accelerate's warning)."""
    param_init_fn: Any = None
    """FSDP1: called on modules on the meta device to materialise them. Refused under FSDP2, which builds
    ranks > 0 from rank 0's weights with `cpu_ram_efficient_loading=True`."""
    sync_module_states: bool | None = None
    """FSDP1: every rank starts from rank 0's parameters and buffers. Under FSDP2 use
    `cpu_ram_efficient_loading=True` (ignored with Accelerate's warning)."""
    activation_checkpointing_offload: bool = False
    """Refused when True: Accelerate needs FSDP2 for it, and accel's FSDP2 does not offload activations (use
    `activation_checkpointing` or `cpu_offload`)."""
    cpu_ram_efficient_loading: bool = False
    """Rank 0's weights are the run's: other ranks drop theirs to the meta device before sharding and
    receive their shards from rank 0 by broadcast. To save host memory, build the model on the meta device
    on ranks > 0 (`with torch.device("meta"): model = Net()`): `prepare` leaves it unplaced and fills its
    shards (a 268 MB model on 2 ranks: rank 1's peak RSS 485 MB instead of 687 MB). A model built in full
    everywhere still trains from rank 0's weights, with no saving."""
    parallelism_config: Any = None
    """accel's link to an `accel.ParallelismConfig` (what `Accelerator(parallelism_config=...)` sets):
    the N-D mesh to shard over (HSDP, FSDP2 x TP). None: one dimension of every process."""

    def __post_init__(self) -> None:
        if self.fsdp_version not in (1, 2):
            raise ValueError(
                f"fsdp_version must be 1 (FullyShardedDataParallel) or 2 (fully_shard); got {self.fsdp_version!r}."
            )
        if self.fsdp_version == 1:
            fsdp1.normalise_fsdp1_options(self)
        else:
            self._fsdp1_options()
        self.set_state_dict_type(self.state_dict_type)
        if isinstance(self.transformer_cls_names_to_wrap, str):
            # Accelerate's form (and its config files'): one string of comma-separated class names.
            names = [n.strip() for n in self.transformer_cls_names_to_wrap.split(",")]
            self.transformer_cls_names_to_wrap = [n for n in names if n]
        policy = self.auto_wrap_policy
        if isinstance(policy, str) and policy.lower() not in WRAP_POLICIES:
            raise ValueError(f"auto_wrap_policy must be one of {WRAP_POLICIES}, a callable or None; got {policy!r}.")
        if self.min_num_params is None:
            self.min_num_params = 0
        if self.min_num_params < 0:
            raise ValueError(f"min_num_params must be >= 0, got {self.min_num_params}.")

    def _fsdp1_options(self) -> None:
        """Map or refuse Accelerate's FSDP1 options, naming the FSDP2 way."""
        notes = []
        if self.sharding_strategy is not None:
            name = getattr(self.sharding_strategy, "name", str(self.sharding_strategy)).upper()
            name = _SHARDING_BY_NUMBER.get(name, name)
            if name == "NO_SHARD":
                raise ValueError("sharding_strategy='NO_SHARD' is plain data parallelism: use strategy='ddp'.")
            if name in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"):
                raise ValueError(
                    f"sharding_strategy={name!r} is hybrid sharding: pass Accelerator(parallelism_config="
                    "ParallelismConfig(dp_replicate_size=<replicas>, dp_shard_size=<shards>)) instead."
                )
            if name not in ("FULL_SHARD", "SHARD_GRAD_OP"):
                raise ValueError(f"Unknown sharding_strategy {self.sharding_strategy!r}.")
            self.reshard_after_forward = name == "FULL_SHARD"
            notes.append("sharding_strategy is deprecated in favor of reshard_after_forward.")
        if self.reshard_after_forward is None:
            self.reshard_after_forward = True
        if isinstance(self.reshard_after_forward, str):
            value = self.reshard_after_forward.strip().lower()
            if value not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(
                    f"reshard_after_forward set to {self.reshard_after_forward}. This is not supported with FSDP2, "
                    "please set to a `bool`"
                )
            self.reshard_after_forward = value in ("true", "1", "yes")
        if self.forward_prefetch is not None and self.forward_prefetch is not False:
            raise ValueError("forward_prefetch is not yet implemented in FSDP2, set to None or use `fsdp_version=1`")
        if self.param_init_fn is not None:
            raise ValueError(
                "param_init_fn is FSDP1's; with FSDP2 build the model on every rank (or on the meta device) and set "
                "cpu_ram_efficient_loading=True to take rank 0's weights."
            )
        if self.activation_checkpointing_offload:
            raise ValueError(
                "activation_checkpointing_offload is not supported on FSDP2 by accel; use activation_checkpointing="
                "True (recompute activations) or cpu_offload=True (offload parameters and optimizer state)."
            )
        if self.backward_prefetch is not None:
            notes.append("backward_prefetch is not supported in FSDP2 (it prefetches one unit ahead); ignored.")
            self.backward_prefetch = None
        if self.use_orig_params is not None:
            notes.append("use_orig_params is obsolete in FSDP2, as FSDP2 always uses the original parameters.")
        if self.sync_module_states is not None:
            notes.append("sync_module_states is obsolete in FSDP2; use cpu_ram_efficient_loading=True.")
        if self.state_dict_config is not None or self.optim_state_dict_config is not None:
            notes.append("state_dict_config/optim_state_dict_config are FSDP1's; state_dict_type decides.")
        if not isinstance(self.cpu_offload, bool):
            # FSDP1's CPUOffload(offload_params=...) or FSDP2's CPUOffloadPolicy.
            self.cpu_offload = bool(getattr(self.cpu_offload, "offload_params", True))
        if notes:
            warnings.warn("FSDP2: " + " ".join(notes), UserWarning, stacklevel=4)

    def set_state_dict_type(self, state_dict_type: Any = None) -> None:
        """Change how `save_state` writes the model ("FULL_STATE_DICT" or "SHARDED_STATE_DICT")."""
        value = str(getattr(state_dict_type, "name", state_dict_type) or "FULL_STATE_DICT").upper()
        if value in ("LOCAL_STATE_DICT", "3"):
            raise ValueError(
                "FSDP2 does not support LOCAL_STATE_DICT. "
                "Please set `fsdp_state_dict_type` to `SHARDED_STATE_DICT` or `FULL_STATE_DICT`."
            )
        value = {"1": "FULL_STATE_DICT", "2": "SHARDED_STATE_DICT"}.get(value, value)
        if value not in STATE_DICT_TYPES:
            raise ValueError(f"state_dict_type must be one of {STATE_DICT_TYPES}, got {state_dict_type!r}.")
        self.state_dict_type = value

    def mp_policy(self, mixed_precision: str) -> Any:
        """The `MixedPrecisionPolicy` for this config under the Accelerator's `mixed_precision`."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        policy = user_policy(self.mixed_precision_policy, MixedPrecisionPolicy)
        if policy is not None:
            return policy
        dtype = _PRECISION_DTYPES.get(mixed_precision)
        if dtype is None:
            return MixedPrecisionPolicy()
        # Reducing gradients in fp32 keeps the sum over ranks as exact as a one-process backward.
        return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)

    def fsdp1_mixed_precision(self, mode: str) -> Any:
        """FSDP1's `MixedPrecision` for this config under the Accelerator's `mixed_precision` (None: full precision).

        As Accelerate's FSDP1 path: bf16/fp16 keep parameters, gradient reduction and buffers in that dtype.
        A `mixed_precision_policy` of the user's (a `MixedPrecision` or a dict of its fields) wins.
        """
        from torch.distributed.fsdp import MixedPrecision

        policy = user_policy(self.mixed_precision_policy, MixedPrecision, "Under fsdp_version=1, ")
        if policy is not None:
            return policy
        dtype = _PRECISION_DTYPES.get(mode)
        return None if dtype is None else MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)

    def offload_policy(self, device: torch.device) -> Any:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        if not self.cpu_offload:
            return OffloadPolicy()
        pin = device.type != "cpu" if self.pin_memory is None else self.pin_memory
        return CPUOffloadPolicy(pin_memory=pin)


def user_policy(policy: Any, kind: type, prefix: str = "") -> Any:
    """The user's `mixed_precision_policy` as a `kind` (given as one, or as a dict of its fields whose dtypes
    may be names); None when unset.

    Raises:
        TypeError: anything else.
    """
    if policy is None or isinstance(policy, kind):
        return policy
    if isinstance(policy, dict):
        return kind(**{k: _dtype(v) for k, v in policy.items()})
    raise TypeError(
        f"{prefix}mixed_precision_policy must be a {kind.__name__}, a dict or None; got {type(policy).__name__}."
    )


def _dtype(value: Any) -> Any:
    if isinstance(value, str):
        dtype = getattr(torch, value, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"Unknown dtype {value!r} in mixed_precision_policy; use a name like 'bfloat16'.")
        return dtype
    return value


def wrap_targets(model: nn.Module, config: FSDPConfig) -> list[nn.Module]:
    """The submodules to shard as their own units, every descendant before its ancestors.

    Raises:
        ValueError: "transformer_based_wrap" without class names, or with names that match
            no module in the model.
    """
    policy = config.auto_wrap_policy
    min_num_params = config.min_num_params or 0
    if policy is None and min_num_params > 0:
        policy = "size_based_wrap"
    # Reversed pre-order visits every module after all of its descendants, so inner units
    # are sharded first and outer ones take only the parameters left over.
    modules = [m for m in reversed(list(model.modules())) if m is not model]
    if callable(policy):
        return [m for m in modules if policy(m)]
    if policy is None:
        return [child for m in modules if isinstance(m, nn.ModuleList) for child in m]
    policy = policy.lower()
    if policy == "no_wrap":
        return []
    if policy == "size_based_wrap":
        return _size_based(model, modules, min_num_params)
    names = config.transformer_cls_names_to_wrap or getattr(model, "_no_split_modules", None)
    if not names:
        raise ValueError(
            "auto_wrap_policy='transformer_based_wrap' needs `transformer_cls_names_to_wrap` (the block classes "
            "or their names), or a model with `_no_split_modules`."
        )
    wanted = {n if isinstance(n, str) else n.__name__ for n in names}
    targets = [m for m in modules if type(m).__name__ in wanted]
    missing = wanted - {type(m).__name__ for m in targets}
    if missing:
        raise ValueError(f"Could not find the transformer layer class {sorted(missing)} in the model.")
    return targets


def _size_based(model: nn.Module, modules: list[nn.Module], min_num_params: int) -> list[nn.Module]:
    remaining: dict[int, int] = {}
    targets: list[nn.Module] = []
    for m in modules:
        own = sum(p.numel() for p in m.parameters(recurse=False))
        count = own + sum(remaining.get(id(c), 0) for c in m.children())
        # Containers have no forward of their own to gather around: their leftovers go up.
        if count >= min_num_params and not isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            targets.append(m)
            count = 0
        remaining[id(m)] = count
    return targets


class FSDP2Strategy(Strategy):
    """Shard models with `fully_shard` over a one-dimensional device mesh of all processes.

    An `FSDPConfig(fsdp_version=1)` gets the FSDP1 subclass (`FSDP1Strategy`) instead.

    The device type of the mesh comes from the adapter (`ctx.device`), so the same code
    runs on any accelerator whose collective backend torch supports. With one process the
    model is left as it is.
    """

    name: ClassVar[str] = "fsdp2"
    compiles_regions_in_place: ClassVar[bool] = True

    def __new__(cls, config: Any = None) -> FSDP2Strategy:
        if cls is FSDP2Strategy and isinstance(config, FSDPConfig) and config.fsdp_version == 1:
            cls = FSDP1Strategy
        return super().__new__(cls)

    def __init__(self, config: Any = None) -> None:
        from .parallelism_config import ParallelismConfig

        # Chosen for `Accelerator(parallelism_config=...)` alone, without FSDP options of the user's.
        self._from_parallelism_config = isinstance(config, ParallelismConfig)
        if isinstance(config, ParallelismConfig):
            config = FSDPConfig(parallelism_config=config)
        if config is not None and not isinstance(config, FSDPConfig):
            raise TypeError(
                f"The fsdp2 strategy takes an accel.FSDPConfig (FullyShardedDataParallelPlugin), "
                f"got {type(config).__name__}."
            )
        super().__init__(config or FSDPConfig())
        self.config: FSDPConfig
        self._mesh: DeviceMesh | None = None
        if self.config.parallelism_config is None:
            from .parallelism_config import from_environment

            self.config.parallelism_config = from_environment()
        self.parallelism: ParallelismConfig | None = self.config.parallelism_config
        self._own_group: Any = None
        self._bound = False

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The N-D mesh `build_mesh` built (None on one process, or before it ran)."""
        return self._mesh

    def build_mesh(self, facts: MeshFacts, pc: ParallelismConfig | None = None) -> None:
        """Validate the N-D config against the run (`facts`, from the Accelerator's state) and build its mesh on
        the adapter's device type; `pc` is adopted when this strategy has no config of its own.

        Raises:
            ValueError: sizes that do not multiply to the number of processes, a dimension the adapter does not
                claim, or (on several processes) a config with nothing to shard (only `dp_replicate_size`), which
                is plain data parallelism, as Accelerate refuses it under FSDP.
        """
        if self.parallelism is None and pc is not None:
            self.parallelism = self.config.parallelism_config = pc
        if self.parallelism is None or self._bound:
            return
        self._bound = True
        self._mesh = _build_nd_mesh(self.parallelism, facts)
        if self._mesh is not None and not self.parallelism.dp_dim_names:
            import torch.distributed as dist

            # Every process is one data shard of its own (tensor/context parallelism over all of them).
            self._own_group, _ = dist.new_subgroups(group_size=1)

    @property
    def materialises_meta_models(self) -> bool:
        """With `cpu_ram_efficient_loading`, a model built on the meta device (ranks > 0) is not placed: its shards
        are created here and filled with rank 0's weights, so those ranks never hold the full model."""
        return bool(self.config.cpu_ram_efficient_loading)

    def distributed_type(self, use_distributed: bool) -> DistributedType | None:
        from ..distributed.distributed_type import DistributedType

        if not use_distributed:
            return DistributedType.NO
        pc = self.parallelism
        if self._from_parallelism_config and pc is not None and not (pc.dp_shard_enabled or pc.cp_enabled):
            # Tensor parallelism (with or without replicas) and no FSDP options: nothing is sharded by FSDP,
            # and Accelerate 1.15 reports the hardware's data parallelism (MULTI_GPU, MULTI_CPU, ...) here.
            return None
        return DistributedType.FSDP

    # ---- prepare --------------------------------------------------------------------------
    def validate_prepare(self, objects: tuple[Any, ...], ctx: RunContext) -> None:
        models = sum(isinstance(o, nn.Module) for o in objects)
        optimizers = sum(isinstance(o, torch.optim.Optimizer) for o in objects)
        if bool(models) != bool(optimizers):
            raise ValueError(MODEL_WITHOUT_OPTIMIZER)

    def data_parallel_group(self) -> Any:
        """The flattened `dp` dimension when tensor or context parallel peers share a batch."""
        pc = self.parallelism
        if pc is None or self._mesh is None or not pc.non_dp_dim_names:
            return None
        return self._mesh["dp"].get_group() if pc.dp_dim_names else self._own_group

    def mesh(self, device: torch.device, world_size: int) -> DeviceMesh:
        if self._mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            self._mesh = init_device_mesh(device.type, (world_size,))
        return self._mesh

    def wrap_model(self, model: nn.Module, ctx: RunContext) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if not ctx.use_distributed or isinstance(model, FSDPModule):
            return model
        config = self.config
        # The core re-points optimizers at the shards (accel.prepare.group.ParameterMap).
        shard_mesh = self._nd_prepare(model, ctx)
        if shard_mesh is None:
            return model
        targets = wrap_targets(model, config)
        if config.activation_checkpointing:
            targets = _apply_activation_checkpointing(model, targets)
        rank0_state = _drop_non_main_weights(model) if config.cpu_ram_efficient_loading else None
        ignored = _ignored_params(model, config.ignored_modules)
        kwargs = {
            **({"ignored_params": ignored} if ignored else {}),
            "mesh": shard_mesh,
            "reshard_after_forward": config.reshard_after_forward,
            "mp_policy": config.mp_policy(ctx.mixed_precision),
            "offload_policy": config.offload_policy(ctx.device),
            **config.extra_kwargs,
        }
        for module in targets:
            fully_shard(module, **kwargs)
        # The root keeps whatever no unit claimed; it is never resharded after forward since
        # backward needs it at once.
        fully_shard(model, **{**kwargs, "reshard_after_forward": False})
        if config.cpu_ram_efficient_loading:
            _load_from_main(model, rank0_state, ctx.device)
        return model

    def _nd_prepare(self, model: nn.Module, ctx: RunContext) -> Any:
        """Apply tensor parallelism (N-D runs); return the mesh to shard over (None: no sharding)."""
        pc = self.parallelism
        if pc is None:
            return self.mesh(ctx.device, ctx.num_processes)
        if self._mesh is None:
            if ctx.use_distributed and not self._bound:
                raise RuntimeError(
                    "The fsdp2 strategy's N-D mesh was never built: call strategy.build_mesh(...) (the Accelerator "
                    "does, through accel.strategies.parallelism_config.bind_parallelism) before preparing."
                )
            return None
        if pc.tp_enabled:
            from .tensor_parallel import apply_tensor_parallel

            apply_tensor_parallel(model, self._mesh["tp"], pc.tp_plan)
        if not pc.dp_shard_cp_dim_names:
            return None
        return self._mesh[tuple(pc.fsdp_dim_names)]

    def unwrap(self, model: nn.Module) -> nn.Module:
        # fully_shard shards in place: the user's module is the prepared one.
        return model

    def is_wrapped(self, model: nn.Module) -> bool:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            return True
        # Tensor parallelism alone leaves the module type as it is but makes its weights DTensors.
        from torch.distributed.tensor import DTensor

        return self.parallelism is not None and any(isinstance(p, DTensor) for p in model.parameters())

    # ---- the step ---------------------------------------------------------------------------
    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        from torch.distributed.fsdp import FSDPModule

        return _no_sync(model) if isinstance(model, FSDPModule) else contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor | None:
        from torch.distributed.tensor import DTensor

        if not any(isinstance(p, DTensor) for p in parameters):
            return None
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return torch.zeros(())
        meshes = {g.device_mesh for g in grads if isinstance(g, DTensor)}
        if len(meshes) <= 1 and all(isinstance(g, DTensor) for g in grads):
            # clip_grad_norm_ reduces over the shards of each DTensor gradient: its norm is global.
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
            return norm.full_tensor() if isinstance(norm, DTensor) else norm
        return _clip_mixed_meshes(grads, max_norm, float(norm_type))

    # ---- state dicts ------------------------------------------------------------------------
    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """The gathered state dict, on the main process only (other ranks get `{}`): the full
        model is built in host memory once, not once per process."""
        if not self.is_wrapped(model):
            return super().full_state_dict(model)
        from .fsdp_checkpoint import gather_model_state_dict

        return gather_model_state_dict(model)

    def load_full_state_dict(self, model: nn.Module, state_dict: dict[str, torch.Tensor], strict: bool = True) -> None:
        if not self.is_wrapped(model):
            super().load_full_state_dict(model, state_dict, strict=strict)
            return
        from .fsdp_checkpoint import load_full_model_state_dict

        load_full_model_state_dict(model, state_dict, strict=strict)

    def save_checkpoint_state(
        self, prepared: Prepared, ctx: RunContext, directory: Path, *, writer: bool, safe_serialization: bool
    ) -> list[str] | None:
        from .fsdp_checkpoint import save_models_and_optimizers

        return save_models_and_optimizers(
            prepared,
            ctx,
            directory,
            sharded=self.config.state_dict_type == "SHARDED_STATE_DICT",
            safe_serialization=safe_serialization,
        )

    def load_checkpoint_state(self, prepared: Prepared, ctx: RunContext, directory: Path, *, strict: bool) -> bool:
        from .fsdp_checkpoint import load_models_and_optimizers

        load_models_and_optimizers(prepared, ctx, directory, strict=strict)
        return True


class FSDP1Strategy(FSDP2Strategy):
    """Shard models with torch's `FullyShardedDataParallel` (FSDP1), as `FSDPConfig(fsdp_version=1)` asks.

    The prepared model is the `FullyShardedDataParallel` wrapper (`unwrap_model` gives the module inside, its
    units still wrapped, as in Accelerate). Gradient clipping runs through the root's `clip_grad_norm_` (the norm
    over every shard), gradient accumulation through its `no_sync`.
    """

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        self._roots: list[weakref.ref[nn.Module]] = []
        self._flat_of: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}

    def build_mesh(self, facts: MeshFacts, pc: ParallelismConfig | None = None) -> None:
        """FSDP1 shards over every process (or hybrid: within nodes, replicated across them); an N-D
        `parallelism_config` that splits the run otherwise is FSDP2's.

        Raises:
            ValueError: a parallelism config with tensor, context or replica dimensions.
        """
        config = self.parallelism if self.parallelism is not None else pc
        if config is not None and (config.tp_enabled or config.cp_enabled or (config.dp_replicate_size or 1) > 1):
            raise ValueError(
                "parallelism_config (tensor, context parallelism or dp_replicate_size) composes with FSDP2 only: "
                "set fsdp_version=2, or use sharding_strategy='HYBRID_SHARD' for FSDP1's replicas across nodes."
            )
        self._bound = True

    def _device_mesh(self, ctx: RunContext) -> Any:
        """The mesh FSDP1 shards over: every process, or (nodes, processes per node) for hybrid sharding."""
        from torch.distributed.device_mesh import init_device_mesh

        if not self.config.sharding_strategy.startswith(("HYBRID", "_HYBRID")):
            return self.mesh(ctx.device, ctx.num_processes)
        per_node = max(1, ctx.local_num_processes)
        if ctx.num_processes % per_node:
            raise ValueError(
                f"{self.config.sharding_strategy} needs the same number of processes on every node; got "
                f"{ctx.num_processes} processes with {per_node} on this node."
            )
        if self._mesh is None:
            self._mesh = init_device_mesh(
                ctx.device.type, (ctx.num_processes // per_node, per_node), mesh_dim_names=("replicate", "shard")
            )
        return self._mesh

    def wrap_model(self, model: nn.Module, ctx: RunContext) -> nn.Module:
        from torch.distributed.fsdp import (
            BackwardPrefetch,
            CPUOffload,
            ShardingStrategy,
        )
        from torch.distributed.fsdp import (
            FullyShardedDataParallel as FSDP,
        )
        from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy

        if not ctx.use_distributed or isinstance(model, FSDP):
            return model
        config = self.config
        before = {name: p for name, p in model.named_parameters()}
        targets = wrap_targets(model, config)
        if config.activation_checkpointing:
            targets = _apply_activation_checkpointing(model, targets)
        if config.sync_module_states:
            fsdp1.broadcast_from_main(model, ctx.device)
        wanted = {id(m) for m in targets}
        ignored = _ignored_params(model, config.ignored_modules)
        ignored_modules = [m for m in model.modules() if any(p in ignored for p in m.parameters(recurse=False))]
        fsdp = FSDP(
            model,
            sharding_strategy=ShardingStrategy[config.sharding_strategy],
            auto_wrap_policy=functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: id(m) in wanted)
            if wanted
            else None,
            backward_prefetch=None if config.backward_prefetch is None else BackwardPrefetch[config.backward_prefetch],
            forward_prefetch=config.forward_prefetch,
            limit_all_gathers=bool(config.limit_all_gathers),
            use_orig_params=bool(config.use_orig_params),
            # On a host-memory device the shards already live in host memory; torch's offload would pin memory,
            # which needs an accelerator.
            cpu_offload=CPUOffload(offload_params=True) if config.cpu_offload and ctx.device.type != "cpu" else None,
            mixed_precision=config.fsdp1_mixed_precision(ctx.mixed_precision),
            param_init_fn=config.param_init_fn,
            ignored_modules=ignored_modules or None,
            device_id=ctx.device,
            device_mesh=self._device_mesh(ctx),
            **config.extra_kwargs,
        )
        fsdp1.set_state_dict_type(fsdp, config, ctx.device)
        self._roots.append(weakref.ref(fsdp))
        if not config.use_orig_params:
            self._flat_of.update(fsdp1.flat_parameters_of(fsdp, before))
        return fsdp

    def setup(self, group: PrepareGroup, prepared: Prepared, ctx: RunContext) -> PrepareGroup:
        """Point the group's optimizers at the flat parameters (use_orig_params=False); each parameter group
        keeps its options.

        Raises:
            ValueError: one unit's parameters are split over several parameter groups.
            PrepareError: the optimizer already has state (it stepped before `prepare`).
        """
        if self._flat_of:
            for optimizer in group.optimizers:
                fsdp1.repoint_to_flat(getattr(optimizer, "optimizer", optimizer), self._flat_of)
        return group

    def grad_scaler(self, scaler: Any) -> Any:
        """fp16: torch's `ShardedGradScaler` with the adapter's settings (`fsdp1.sharded_grad_scaler`)."""
        return fsdp1.sharded_grad_scaler(scaler)

    def unwrap(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        while isinstance(model, FSDP):
            model = model.module
        return model

    def is_wrapped(self, model: nn.Module) -> bool:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return isinstance(model, FSDP)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager[Any]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return model.no_sync() if isinstance(model, FSDP) else contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor | None:
        """The root wrapper's `clip_grad_norm_` (the norm over every rank's shards) for the model these
        parameters belong to; None for parameters of no FSDP1 model (the plain path)."""
        wanted = {id(p) for p in parameters}
        for ref in self._roots:
            root = ref()
            if root is not None and wanted & {id(p) for p in root.parameters()}:
                norm: torch.Tensor = root.clip_grad_norm_(max_norm, norm_type)  # type: ignore[operator]
                return norm
        return None


def _build_nd_mesh(pc: ParallelismConfig, facts: MeshFacts) -> DeviceMesh | None:
    """Validate `pc` against the run and its adapter, and build its mesh on the adapter's device type."""
    pc.validate(facts.num_processes, facts.capabilities, facts.adapter_name)
    if not facts.use_distributed:
        return None
    if not pc.dp_shard_enabled and not pc.cp_enabled and not pc.tp_enabled:
        raise ValueError(
            "FSDP is enabled but the parallelism config has no dimension for FSDP to shard across (both "
            "`dp_shard_size` and `cp_size` are 1). It only replicates, which is plain data parallelism: Drop the "
            "fsdp_plugin (or strategy='fsdp2') to run it as DDP, or set dp_shard_size > 1 to shard the model."
        )
    return pc.get_device_mesh(facts.device_type)


def _ignored_params(model: nn.Module, ignored: Any) -> set[nn.Parameter]:
    """Parameters of `ignored_modules` (modules, or a regex matched against module names)."""
    if ignored is None:
        return set()
    if isinstance(ignored, str):
        pattern = re.compile(ignored)
        modules = [m for n, m in model.named_modules() if pattern.fullmatch(n)]
    else:
        modules = list(ignored)
    return {p for m in modules for p in m.parameters()}


def _drop_non_main_weights(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """Rank 0 keeps its full weights (references, not a copy: `fully_shard` copies each shard out of them and
    leaves them unchanged) until they are broadcast; other ranks move their weights to the meta device (a model
    built there already stays there)."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        return dict(model.state_dict())
    model.to("meta")
    return None


def _load_from_main(model: nn.Module, rank0_state: dict[str, torch.Tensor] | None, device: torch.device) -> None:
    """Materialise the shards of every rank and fill them with rank 0's weights (broadcast)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if rank0_state is None:
        model.to_empty(device=device)
    set_model_state_dict(
        model,
        dict(rank0_state or {}),  # type: ignore[arg-type]
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )


def _clip_mixed_meshes(grads: list[torch.Tensor], max_norm: float, norm_type: float) -> torch.Tensor:
    """Clip gradients that live on different meshes (FSDP2 x TP: sharded 2-D and 1-D) by their global norm."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        norms = []
        for g in grads:
            n = torch.linalg.vector_norm(g, norm_type)
            norms.append(n.full_tensor() if isinstance(n, DTensor) else n)
        total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]), norm_type)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            local = g.to_local() if isinstance(g, DTensor) else g
            local.mul_(coef.to(local.dtype))
    return total


@contextlib.contextmanager
def _no_sync(model: nn.Module) -> Iterator[None]:
    model.set_requires_gradient_sync(False)  # type: ignore[operator]
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)  # type: ignore[operator]


def _apply_activation_checkpointing(model: nn.Module, targets: list[nn.Module]) -> list[nn.Module]:
    """Wrap each target in a checkpoint wrapper; returns the wrappers, which become the units
    so that FSDP gathers parameters around the recomputation as well."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        CheckpointWrapper,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    if not targets:
        raise ValueError(
            "activation_checkpointing=True needs at least one wrapped unit to recompute; the wrap policy "
            "selected none. Set `auto_wrap_policy` or `transformer_cls_names_to_wrap`."
        )
    wanted = {id(m) for m in targets}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in wanted,
    )
    wrappers = {id(m._checkpoint_wrapped_module): m for m in model.modules() if isinstance(m, CheckpointWrapper)}
    return [wrappers[id(m)] for m in targets]
