"""`ParallelismConfig`: how processes are arranged on an N-D device mesh (Accelerate's names).

A run of `dp_replicate_size * dp_shard_size * cp_size * tp_size` processes is laid out on a
`torch.distributed.device_mesh.DeviceMesh` with named dimensions, outermost first:
`dp_replicate` (model replicas, HSDP's outer dimension), `dp_shard` (FSDP2 shards), `cp`
(context parallelism), `tp` (tensor parallelism). Flattened dimensions are added: `dp`
(every rank holding different data), `dp_shard_cp` (what FSDP2 shards over) and `dp_cp`
(what the loss is averaged over). The mesh is built on the adapter's device type; the core
names no device.

Sizes left as None come from `ACCEL_PARALLELISM_<FIELD>` (e.g. `ACCEL_PARALLELISM_TP_SIZE`),
else Accelerate's `PARALLELISM_CONFIG_<FIELD>`, else 1.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

from ..settings.env import read_env

_MESH_ORDER = ("dp_replicate", "dp_shard", "cp", "sp", "tp")
_SIZE_FIELDS = ("dp_replicate", "dp_shard", "tp", "cp", "sp")


def _env(name: str, default: str) -> str:
    return read_env().parallelism.get(name, default)


@dataclass
class TorchTensorParallelConfig:
    """Options of torch tensor parallelism (Accelerate's class; `enable_async_tp` is not supported and ignored)."""

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            warnings.warn("Async tensor parallelism is currently not supported, ignoring this option.", stacklevel=2)


@dataclass
class TorchContextParallelConfig:
    """Options of torch context parallelism: `cp_comm_strategy` is "allgather" (default) or "alltoall"."""

    cp_comm_strategy: str | None = None

    def __post_init__(self) -> None:
        if self.cp_comm_strategy is None:
            self.cp_comm_strategy = _env("cp_comm_strategy", "allgather")
        if self.cp_comm_strategy not in ("allgather", "alltoall"):
            raise ValueError(
                f"Invalid cp_comm_strategy: {self.cp_comm_strategy}. Must be one of 'allgather' or 'alltoall'."
            )


@dataclass
class ParallelismConfig:
    """How the processes are split between data, tensor and context parallelism.

    Pass it as `Accelerator(parallelism_config=...)`. `dp_shard_size > 1` shards the model with
    FSDP2; with `dp_replicate_size > 1` too it is HSDP (replicas of sharded groups);
    `tp_size > 1` applies tensor parallelism from `tp_plan`, else from the model's own
    `tp_plan` (the transformers convention: module-name patterns such as
    `"layers.*.mlp.up_proj"` mapped to "colwise", "rowwise", ...). The sizes must multiply to
    the number of processes.

    Args:
        dp_replicate_size: replicas of the model (the outer dimension of HSDP).
        dp_shard_size: processes one replica's parameters are sharded over (FSDP2).
        tp_size: processes one layer's weights are split over (tensor parallelism).
        cp_size: processes one sequence is split over (context parallelism; adapters that claim it only).
        cp_backend: "torch", the only context-parallel backend.
        sp_size: sequence parallelism of the DeepSpeed strategy (not supported by accel: must be 1).
        sp_backend: "deepspeed".
        tp_handler, cp_handler, sp_handler: per-dimension options (`TorchTensorParallelConfig`, ...).
        tp_plan: accel's addition: an explicit plan (pattern -> style name or a torch `ParallelStyle`)
            that wins over the model's `tp_plan`.
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: TorchContextParallelConfig | None = None
    sp_handler: Any = None
    tp_plan: dict[str, Any] | None = field(default=None, repr=False)

    device_mesh = None

    def __post_init__(self) -> None:
        for name in _SIZE_FIELDS:
            if getattr(self, f"{name}_size") is None:
                setattr(self, f"{name}_size", int(_env(f"{name}_size", "1")))
        if self.cp_backend is None:
            self.cp_backend = _env("cp_backend", "torch")
        if self.sp_backend is None:
            self.sp_backend = _env("sp_backend", "deepspeed")
        if self.tp_size > 1 and self.tp_handler is None:  # type: ignore[operator]
            self.tp_handler = TorchTensorParallelConfig()
        if self.cp_size > 1:  # type: ignore[operator]
            if self.cp_handler is None:
                self.cp_handler = TorchContextParallelConfig()
            elif not isinstance(self.cp_handler, TorchContextParallelConfig):
                raise ValueError(
                    f"ParallelismConfig's cp_backend={self.cp_backend} requires {TorchContextParallelConfig}, but "
                    f"cp_handler was set to {type(self.cp_handler)}"
                )
        for name in ("dp_replicate", "dp_shard", "tp", "cp"):
            size = getattr(self, f"{name}_size")
            if size < 1:
                raise ValueError(f"{name}_size must be at least 1, but got {size}")
        if self.cp_backend != "torch":
            raise ValueError(f"cp_backend must be one of ['torch'], but got {self.cp_backend}")
        if self.sp_size < 1:  # type: ignore[operator]
            raise ValueError(f"sp_size must be at least 1, but got {self.sp_size}")
        if self.sp_backend != "deepspeed":
            raise ValueError(f"sp_backend must be one of ['deepspeed'], but got {self.sp_backend}")
        if self.cp_size > 1 and self.sp_size > 1:  # type: ignore[operator]
            raise ValueError(
                "Context Parallelism (CP) and Sequence Parallelism (SP) are mutually exclusive. "
                f"Got cp_size={self.cp_size} and sp_size={self.sp_size}. Please set either cp_size=1 or sp_size=1."
            )
        if (self.tp_enabled or self.cp_enabled) and self.dp_replicate_enabled and not self.dp_shard_enabled:
            raise ValueError(
                "Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism "
                "(dp_replicate_size > 1 and dp_shard_size == 1). Please set dp_shard_size > 1 and "
                "dp_replicate_size == 1 to compose FSDP + TP/CP for 2D parallel, or set dp_replicate_size > 1 and "
                "dp_shard_size > 1 to compose HSDP + TP/CP for 3D parallel."
            )
        self._sizes = {name: getattr(self, f"{name}_size") for name in _SIZE_FIELDS}

    # ---- sizes and names (Accelerate's properties) -------------------------------------
    @property
    def total_size(self) -> int:
        """The product of all sizes (must equal the number of processes)."""
        return self.dp_replicate_size * self.dp_shard_size * self.tp_size * self.cp_size * self.sp_size  # type: ignore[operator]

    @property
    def non_data_parallel_size(self) -> int:
        """Processes that see the same batch: tensor x context (x sequence) parallel sizes."""
        return self.tp_size * self.cp_size * self.sp_size  # type: ignore[operator]

    @property
    def data_parallel_size(self) -> int:
        """Processes holding different data: `dp_replicate_size * dp_shard_size`."""
        return self.dp_replicate_size * self.dp_shard_size  # type: ignore[operator]

    @property
    def dp_replicate_enabled(self) -> bool:
        return self.dp_replicate_size > 1  # type: ignore[operator]

    @property
    def dp_shard_enabled(self) -> bool:
        return self.dp_shard_size > 1  # type: ignore[operator]

    @property
    def tp_enabled(self) -> bool:
        return self.tp_size > 1  # type: ignore[operator]

    @property
    def cp_enabled(self) -> bool:
        return self.cp_size > 1  # type: ignore[operator]

    @property
    def sp_enabled(self) -> bool:
        return self.sp_size > 1  # type: ignore[operator]

    @property
    def dp_dim_names(self) -> list[str]:
        """Enabled dimensions over which data is split."""
        return [n for n, on in (("dp_replicate", self.dp_replicate_enabled), ("dp_shard", self.dp_shard_enabled)) if on]

    @property
    def non_dp_dim_names(self) -> list[str]:
        """Enabled dimensions whose ranks receive the same batch."""
        return [n for n, on in (("tp", self.tp_enabled), ("cp", self.cp_enabled), ("sp", self.sp_enabled)) if on]

    @property
    def dp_shard_cp_dim_names(self) -> list[str]:
        """Enabled dimensions flattened into `dp_shard_cp`, which FSDP2 shards over."""
        return [n for n, on in (("dp_shard", self.dp_shard_enabled), ("cp", self.cp_enabled)) if on]

    @property
    def dp_cp_dim_names(self) -> list[str]:
        """Enabled dimensions the loss is averaged over."""
        return self.dp_dim_names + (["cp"] if self.cp_enabled else [])

    @property
    def fsdp_dim_names(self) -> list[str]:
        """The mesh dimensions FSDP2 is applied over (HSDP adds `dp_replicate`)."""
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard_cp"]

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    # ---- the mesh --------------------------------------------------------------------------
    def _get_mesh(self) -> tuple[tuple[Any, ...], ...]:
        """(dimension names, sizes) in the canonical order, or () when every size is 1."""
        dims = sorted(self.active_mesh_dims, key=_MESH_ORDER.index)
        return tuple(zip(*[(d, self._sizes[d]) for d in dims]))

    def _set_size(self, parallelism: str, size: int) -> None:
        if parallelism not in self._sizes:
            raise ValueError(f"Parallelism must be one of {tuple(self._sizes)}, got {parallelism!r}.")
        self._sizes[parallelism] = size
        setattr(self, f"{parallelism}_size", size)

    def build_device_mesh(self, device_type: str) -> Any:
        """Build the named mesh (and its flattened `dp`, `dp_shard_cp`, `dp_cp`) on `device_type`.

        Returns None when every size is 1.
        """
        from torch.distributed.device_mesh import init_device_mesh

        mesh = self._get_mesh()
        if not mesh:
            return None
        names, shape = mesh
        device_mesh = init_device_mesh(device_type, tuple(shape), mesh_dim_names=tuple(names))
        for flat, dims in (("dp", self.dp_dim_names), ("dp_shard_cp", self.dp_shard_cp_dim_names)):
            if dims:
                device_mesh[tuple(dims)]._flatten(flat)
        if self.dp_cp_dim_names:
            device_mesh[tuple(self.dp_cp_dim_names)]._flatten("dp_cp")
        return device_mesh

    def get_device_mesh(self, device_type: str | None = None) -> Any:
        """The mesh, built on `device_type` the first time."""
        if self.device_mesh is None:
            if device_type is None:
                raise ValueError(
                    "You need to pass a device_type e.g. the adapter's device type to build the device mesh"
                )
            self.device_mesh = self.build_device_mesh(device_type)
        elif device_type is not None and self.device_mesh.device_type != device_type:
            raise ValueError(
                f"The device_mesh is already created with device type {self.device_mesh.device_type}. However, you "
                f"are trying to get a device mesh with device_type {device_type}. Please check if you correctly "
                "initialized your device_mesh"
            )
        return self.device_mesh

    def validate(self, num_processes: int, capabilities: Any, adapter_name: str) -> None:
        """Check the sizes against the run and what the adapter supports (raises ValueError saying what to change)."""
        if self.sp_enabled:
            raise ValueError(
                "sp_size > 1 (DeepSpeed Ulysses sequence parallelism) is not supported by accel; set sp_size=1, or "
                "use cp_size for context parallelism on an adapter that supports it."
            )
        if self.total_size == 1 and num_processes > 1:
            # Plain data parallelism over every process, as in Accelerate.
            self._set_size("dp_replicate", num_processes)
        if self.total_size != num_processes:
            raise ValueError(
                f"ParallelismConfig total_size ({self.total_size}) does not match num_processes ({num_processes}). "
                "Please adjust dp_replicate_size/dp_shard_size/tp_size/cp_size/sp_size."
            )
        supported = frozenset(getattr(capabilities, "parallelism", frozenset()))
        wanted = {"tp": self.tp_enabled, "cp": self.cp_enabled, "hsdp": self.dp_replicate_enabled}
        for kind, on in wanted.items():
            if on and kind not in supported:
                raise ValueError(
                    f"The {adapter_name!r} adapter does not support {_KIND_NAMES[kind]} ({kind}); it supports "
                    f"{sorted(supported) or 'none'}. Set {_KIND_FIELDS[kind]}=1, or use an adapter that supports it "
                    "(docs/parallelism.md)."
                )
        for name, size in self._sizes.items():
            if size == 1 and getattr(self, f"{name}_handler", None) is not None:
                warnings.warn(
                    f"ParallelismConfig.{name}_handler is set, but {name}_size is set to 1. This handler will be ignored.",
                    UserWarning,
                    stacklevel=3,
                )

    def to_json(self) -> dict[str, Any]:
        """The sizes and backends as a plain dict (the mesh is left out)."""
        return {
            **{f"{n}_size": s for n, s in self._sizes.items()},
            "cp_backend": self.cp_backend,
            "sp_backend": self.sp_backend,
        }


_KIND_NAMES = {"tp": "tensor parallelism", "cp": "context parallelism", "hsdp": "hybrid sharding (HSDP)"}
_KIND_FIELDS = {"tp": "tp_size", "cp": "cp_size", "hsdp": "dp_replicate_size"}


# Accelerate's launch flags / config keys (`parallelism_config_<name>`) that accel honours.
LAUNCH_KEYS = ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "cp_comm_strategy")


def launch_env(settings: dict[str, Any]) -> dict[str, str]:
    """The worker environment for Accelerate's parallelism launch settings (`--parallelism_config_tp_size 2`,
    or a config file's `parallelism_config:` mapping): `ACCEL_USE_PARALLELISM_CONFIG=1` and one
    `ACCEL_PARALLELISM_<NAME>` each.

    Raises:
        ValueError: a sequence-parallel setting above 1 (DeepSpeed Ulysses is not supported) or an unknown key.
    """
    env = {"ACCEL_USE_PARALLELISM_CONFIG": "1"}
    for key, value in settings.items():
        name = key.removeprefix("parallelism_config_")
        if value is None or name == "use_parallelism_config":
            continue
        if name.startswith("sp_"):
            if name == "sp_size" and int(value) > 1:
                raise ValueError(
                    f"{key}={value}: DeepSpeed Ulysses sequence parallelism is not supported by accel; use "
                    "parallelism_config_cp_size on an adapter that supports context parallelism."
                )
            continue
        if name not in LAUNCH_KEYS:
            raise ValueError(f"Unknown parallelism setting {key!r}; accel knows parallelism_config_{LAUNCH_KEYS}.")
        env[f"ACCEL_PARALLELISM_{name.upper()}"] = str(value)
    return env


def from_environment() -> ParallelismConfig | None:
    """A `ParallelismConfig` from the launcher's variables when it asked for one (`ACCEL_USE_PARALLELISM_CONFIG`,
    or Accelerate's `ACCELERATE_USE_PARALLELISM_CONFIG`), else None."""
    return ParallelismConfig() if read_env().use_parallelism_config else None


def as_parallelism_config(pc: Any) -> ParallelismConfig:
    """`pc` as accel's class: an object of Accelerate's `ParallelismConfig` (the same fields) is rebuilt, keeping
    its sizes, `cp_backend`, `tp_plan` and its context-parallel handler's `cp_comm_strategy`.

    Raises:
        TypeError: `pc` has not the fields of a ParallelismConfig.
    """
    if isinstance(pc, ParallelismConfig):
        return pc
    if not all(hasattr(pc, f"{n}_size") for n in ("dp_replicate", "dp_shard", "tp", "cp")):
        raise TypeError(f"parallelism_config must be an accel.ParallelismConfig, got {type(pc).__name__}.")
    cp_handler = getattr(pc, "cp_handler", None)
    tp_handler = getattr(pc, "tp_handler", None)
    return ParallelismConfig(
        **{f"{n}_size": getattr(pc, f"{n}_size") for n in ("dp_replicate", "dp_shard", "tp", "cp")},
        sp_size=getattr(pc, "sp_size", None),
        cp_backend=getattr(pc, "cp_backend", None),
        tp_plan=getattr(pc, "tp_plan", None),
        cp_handler=None
        if cp_handler is None
        else TorchContextParallelConfig(cp_comm_strategy=getattr(cp_handler, "cp_comm_strategy", None)),
        tp_handler=None
        if tp_handler is None
        else TorchTensorParallelConfig(enable_async_tp=bool(getattr(tp_handler, "enable_async_tp", False))),
    )


def only_replicates(pc: ParallelismConfig) -> bool:
    """True when `pc` splits nothing but the data (no shard, tensor, context or sequence dimension): plain data
    parallelism, which runs on the data-parallel strategy (DDP) as in Accelerate."""
    return not (pc.dp_shard_enabled or pc.tp_enabled or pc.cp_enabled or pc.sp_enabled)


def with_parallelism(pc: Any, strategy: str | None, strategy_config: Any) -> tuple[str | None, Any]:
    """The strategy and its config for `Accelerator(parallelism_config=pc)`.

    Sharding, tensor and context parallelism compose on FSDP2 (an `FSDPConfig` given as `fsdp_plugin` keeps its
    fields and gains `pc`). A config that only replicates (`ParallelismConfig()`, `dp_replicate_size=N` alone)
    is plain data parallelism: it leaves the strategy as chosen (None: the adapter's default, DDP), and
    `attach_parallelism` gives it the config and its mesh, as Accelerate runs it as DDP. With FSDP2 chosen
    (`fsdp_plugin`), such a config is refused on several processes, as in Accelerate (nothing to shard over).

    Raises:
        ValueError: `pc` splits the model (shard, tensor, context sizes above 1) under another strategy
            (ddp, deepspeed, megatron).
        TypeError: `pc` is not a ParallelismConfig.
    """
    pc = as_parallelism_config(pc)
    if strategy is None and hasattr(strategy_config, "parallelism_config"):
        strategy = "fsdp2"  # an FSDPConfig from the launcher's settings
    if strategy not in (None, "fsdp2"):
        if only_replicates(pc):
            return strategy, strategy_config
        raise ValueError(
            f"parallelism_config composes data sharding, tensor and context parallelism on the fsdp2 strategy; got "
            f"strategy={strategy!r}. Drop that strategy (or its plugin), or use the fsdp_plugin."
        )
    if strategy is None and only_replicates(pc):
        return None, strategy_config
    if strategy_config is None or isinstance(strategy_config, ParallelismConfig):
        return "fsdp2", pc  # the fsdp2 strategy takes a ParallelismConfig as its config
    # An FSDPConfig (fsdp_plugin): its fields stand, the mesh is `pc`'s.
    strategy_config.parallelism_config = pc
    return "fsdp2", strategy_config


def bind_parallelism(strategy: Any, pc: ParallelismConfig | None, state: Any) -> None:
    """Give the run's strategy its mesh once the processes are known (called by the Accelerator right after it
    builds the strategy, so `accelerator.torch_device_mesh` exists from construction on, as in Accelerate).

    `state` is the run's state (`num_processes`, `use_distributed`, `device`, `backend`, `mixed_precision`,
    `adapter`): this module reads nothing global. Every strategy gets these facts first (`Strategy.learn_run`: the
    DeepSpeed strategy, which transformers may ask for its ZeRO-3 config before `prepare`). A strategy with a
    `build_mesh` hook (FSDP2) validates and builds its own N-D mesh, adopting `pc` if it has none. Any other
    strategy (DDP, ...) takes a replicate-only `pc` as it is, in its public `parallelism` and `device_mesh`
    attributes: with every size 1 on several processes `dp_replicate_size` becomes the number of processes
    (Accelerate's `_validate_accelerator`), else the sizes must multiply to it; its mesh has the `dp_replicate`
    dimension (with the flattened `dp` and `dp_cp`) on the adapter's device type, None on one process.

    Raises:
        ValueError: the sizes do not multiply to the number of processes, or the adapter lacks a dimension.
    """
    facts = MeshFacts(
        num_processes=int(state.num_processes),
        use_distributed=bool(state.use_distributed),
        device_type=state.device.type,
        capabilities=state.adapter.capabilities,
        adapter_name=state.adapter.name,
        backend=str(state.backend),
        mixed_precision=str(state.mixed_precision),
    )
    strategy.learn_run(facts)
    build = getattr(strategy, "build_mesh", None)
    if build is not None:
        build(facts, pc)
        return
    if pc is None or getattr(strategy, "parallelism", None) is not None:
        return
    pc.validate(facts.num_processes, facts.capabilities, facts.adapter_name)
    strategy.parallelism = pc
    strategy.device_mesh = pc.get_device_mesh(facts.device_type) if facts.use_distributed else None


@dataclass(frozen=True)
class MeshFacts:
    """What building a run's mesh needs to know about the run (from the Accelerator's state)."""

    num_processes: int
    use_distributed: bool
    device_type: str
    capabilities: Any
    adapter_name: str
    backend: str = ""
    """The process group's backend (the adapter's, or `InitProcessGroupKwargs(backend=)`)."""
    mixed_precision: str = "no"
    """The run's mixed precision mode."""
