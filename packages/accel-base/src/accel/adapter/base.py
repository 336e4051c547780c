"""The adapter contract: the one place that owns a kind of hardware.

An adapter says which device a local rank uses, which collective backend joins the
processes, how autocast and loss scaling work there, and answers the prepare walk's hardware
questions (whether and how a model is placed, a vendor's own model optimisation, its compile
backend); the core drives the walk (`accel.prepare.walk`) and the adapter never calls a strategy.
Every method has the plain-PyTorch behaviour as its default, so an adapter overrides only what its
hardware does differently. Nothing outside an adapter touches a vendor module.

Emulation (`ACCEL_EMULATE=1`): the adapter keeps every decision and swaps only the
device (for `cpu`), the backend (for `gloo`) and the one module holding vendor calls
(`vendor_module` -> `emulated_vendor_module`). Emulation replaces the vendor call,
never the decision.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from ..distributed.distributed_type import DistributedType
from ..precision.base import PRECISION_MODES
from .legacy import LegacyPrepareHooks
from .options import AdapterOptions, AdapterOptionsError

if TYPE_CHECKING:
    from ..precision.base import Precision
    from ..prepare.context import RunContext
    from ..settings.kwargs import TorchDynamoPlugin

ADAPTER_API_VERSION = 3
"""Version of this contract (an adapter declares the one it was built for in `Adapter.api_version`).

From 2 to 3 (docs/adapters.md, "Versions of the contract", says what a version-2 adapter changes):

- The core drives the prepare walk (`accel.prepare.walk`): placement, the vendor's model optimisation,
  precision, the strategy, compilation, in that order, one way. An adapter answers hardware questions
  along it and never calls a strategy or builds a precision. Added, each with a default:
  `places_model` (whether a model is moved, e.g. a rule for multi-process training), `optimize_model`
  (a vendor's model optimisation between placement and precision), `compile_backends` (the
  `torch.compile` backends this hardware runs; the core refuses others, and any when
  `Capabilities.compile` is False), and `check_strategy` (refuse a strategy the adapter's options rule out).
- Removed from what a version-3 adapter may define: `prepare_model`, `apply_precision`, `apply_strategy`,
  `compile_model` (the walk's steps) and `convert_to_fp8` (module conversion, fp8 included, is the
  precision class's: `Precision.convert_fp8` in the adapter's `precision_class`). A version-3 adapter
  class that defines one is refused by name when adapters are discovered (`LEGACY_PREPARE_HOOKS`).
- `PrepareContext` is `RunContext`: one frozen context for prepare and run, with the facts of the object
  being prepared (`device_placement`, `evaluation_mode`, `optimizers`) and `optimizer_on_host`.
- Versions 1 and 2 still load, with a `DeprecationWarning`, for this minor release: their prepare hooks run
  as before (`LegacyPrepareHooks`), the core then giving the model to the strategy's `setup` only.

From 1 to 2:

- Added, each with a default: `data_parallel_name`/`data_parallel_type`, `availability_probes`,
  `default_strategy`, `strategy_aliases`, `options_class`, `accelerate_config_keys`, `precision_class`,
  `repoints_paired_optimizers`, `has_own_optimizer_step`, `before_process_group`,
  `process_group_options`, `dynamo_settings`, `compiled_autograd`, `Capabilities.parallelism`,
  and the `PrepareContext` fields `adapter_defaults`, `precision`, `optimizers`, `backend` and
  `device_placement_requested`.
- Removed: `synchronize` and `memory_stats` (nothing called them; defining them is harmless), the
  `PrepareContext` fields `extras` and `ddp_output_device`, and `backward` and `no_sync`: the backward
  pass and pausing gradient synchronisation belong to the strategy (`REMOVED_ADAPTER_HOOKS`).
- Changed behaviour: the core re-points optimizers at the parameters `prepare_model` replaced, and
  schedulers follow an optimizer `prepare_optimizer` replaced (version 1 left both to the adapter);
  `Capabilities.strategies` is enforced (`StrategyNotSupportedError`); under fp16 the grad scaler
  steps through `optimizer_step`; `empty_cache`, `manual_seed` and the device RNG hooks call the
  vendor module's functions of those names when it has them; a data-parallel run reports
  `DistributedType.MULTI_CPU` unless `data_parallel_name` says otherwise; options given to an
  adapter without `options_class` or an `__init__` of its own raise `AdapterOptionsError`.
"""
REMOVED_ADAPTER_HOOKS: Mapping[str, str] = {
    "backward": "run the backward pass in a strategy of your package (`Strategy.backward`)",
    "no_sync": "pause gradient synchronisation in a strategy of your package (`Strategy.no_sync`)",
}
"""Version-1 adapter hooks the core no longer calls, with what to do instead: an adapter class that
defines one is refused by name (its behaviour would otherwise be skipped without a word)."""

LEGACY_PREPARE_HOOKS: Mapping[str, str] = {
    "prepare_model": "let the core's walk prepare the model; answer `places_model`, `place_model` and `optimize_model`",
    "apply_precision": "convert modules in your precision class (`Precision.convert_module`, `precision_class`)",
    "apply_strategy": "refuse a strategy in `check_strategy`; the core hands the model to the strategy",
    "compile_model": "answer `compile_backend`, `compile_backends` and `dynamo_settings`; the core compiles",
    "convert_to_fp8": "convert layers in your precision class (`Precision.convert_fp8`, `precision_class`)",
}
"""Prepare hooks of versions 1 and 2, with what a version-3 adapter does instead. A version-1 or -2 adapter
that defines one keeps working (with a `DeprecationWarning`); a version-3 adapter that defines one is refused
by name when adapters are discovered."""

SUPPORTED_ADAPTER_API_VERSIONS = frozenset({1, 2, 3})
"""Versions that load. A version-1 or -2 adapter runs on the version-3 core as it is, with a
`DeprecationWarning` (`DEPRECATED_ADAPTER_API_VERSIONS`), unless it used a removed `PrepareContext` field,
runs a strategy missing from its `capabilities.strategies`, or relies on a behaviour that changed (see
`ADAPTER_API_VERSION`); any other version is refused by name."""

DEPRECATED_ADAPTER_API_VERSIONS = frozenset({1, 2})
"""Versions that still load for this minor release, with a `DeprecationWarning` saying what to change."""

PRECISIONS = PRECISION_MODES


@dataclass(kw_only=True, frozen=True)
class Capabilities:
    """What an adapter claims; the conformance kit tests every claim and skips the rest."""

    precisions: frozenset[str] = frozenset({"no"})
    """Mixed-precision modes the adapter runs ("no", "bf16", "fp16", "fp8")."""
    strategies: frozenset[str] = frozenset({"ddp"})
    """Strategies (entry points in `accel.strategies`) the adapter applies."""
    compile: bool = False
    """Whether `torch.compile` works through the adapter."""
    multi_process: bool = True
    """Whether several processes can run on one host (2 ranks in the kit)."""
    parallelism: frozenset[str] = frozenset()
    """N-D parallelism the adapter runs on its device mesh (`ParallelismConfig`): "tp" (tensor
    parallelism), "hsdp" (replicated shard groups), "cp" (context parallelism)."""


@dataclass(kw_only=True, frozen=True)
class Availability:
    """Whether an adapter can run here, and why not when it cannot."""

    available: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.available


class Adapter(LegacyPrepareHooks):
    """Base class of every hardware adapter.

    Subclasses set `name`, `priority`, `device_type`, `backend`, `capabilities` and
    override `availability()`; the rest has working defaults.
    """

    name: ClassVar[str] = "base"
    """Name users pass to `Accelerator(adapter=...)`, `ACCEL_ADAPTER` and `accel launch --adapter`."""
    priority: ClassVar[int] = 0
    """Among available adapters the highest priority is chosen when none is named."""
    api_version: ClassVar[int] = ADAPTER_API_VERSION
    """The contract version the adapter was built for (`ADAPTER_API_VERSION` unless it says otherwise);
    one outside `SUPPORTED_ADAPTER_API_VERSIONS` is refused by name when adapters are discovered."""
    hardware_device_type: ClassVar[str] = "cpu"
    """torch device type on real hardware (e.g. the vendor's device string)."""
    hardware_backend: ClassVar[str] = "gloo"
    """torch.distributed backend on real hardware."""
    capabilities: ClassVar[Capabilities] = Capabilities()
    vendor_module: ClassVar[str | None] = None
    """Dotted path of the adapter's module of vendor calls (the only one that imports the vendor)."""
    emulated_vendor_module: ClassVar[str | None] = None
    """Dotted path of its CPU stand-in, used under emulation."""
    checkpoint_on_host: ClassVar[bool] = False
    """`save_state` writes optimizer state and registered objects as host (CPU) tensors and
    `load_state` reads them onto the host; the optimizer's `load_state_dict` then places the
    state next to its parameters. For devices whose tensors `torch.load` cannot restore."""
    data_parallel_name: ClassVar[str] = "MULTI_CPU"
    """The `DistributedType` name data-parallel runs on this hardware report, as Accelerate
    names it (MULTI_CPU; an accelerator's adapter says MULTI_<DEVICE>), so scripts that compare
    `accelerator.distributed_type` against Accelerate's members keep working."""
    accelerate_config_keys: ClassVar[Mapping[str, str | None]] = {}
    """Keys of an Accelerate config file (`accelerate config`) whose `distributed_type` is this
    adapter's `data_parallel_name` that only this hardware has: key -> None (harmless, ignored with
    one note) or the reason it is refused (what to do instead). `accel launch --config_file` reads it."""
    accelerate_env: ClassVar[Mapping[str, str]] = {}
    """Variables of Accelerate's launcher this adapter honours, whatever hardware runs: `ACCELERATE_<NAME>` -> the
    adapter's own variable, which gets the value unchanged (an own variable already set wins). Without an entry
    here such a variable is warned about as one accel cannot honour."""

    @classmethod
    def accelerate_config_settings(cls, key: str, value: Any) -> dict[str, Any] | None:
        """`accel launch` settings for a key of an Accelerate config file (`accelerate config`) that this adapter
        reads whatever the file's `distributed_type`: launch destinations (`"adapter"`, the destinations of the
        adapter's own flags) -> values, which fill what the command line left unset. None (the default): not a key
        of this adapter's.

        Raises:
            ValueError: a value the adapter cannot take (reported with the key's line).
        """
        return None

    options_class: ClassVar[type[AdapterOptions] | None] = None
    """The adapter's options (an `accel.adapter.options.AdapterOptions` dataclass): parsed into
    `self.config` at construction (its environment variables, then `Accelerator(adapter_options=...)`),
    and the source of the adapter's `accel launch` flags and the variables they set."""

    def __init__(self, *, emulate: bool = False, options: Mapping[str, Any] | None = None) -> None:
        """`options`: the adapter's own settings by name (`Accelerator(adapter_options=...)`), parsed
        with `options_class` into `self.config` (an adapter without one may parse them in its own `__init__`).

        Raises:
            accel.adapter.options.AdapterOptionsError: options given to an adapter that takes none, an
                unknown option, or a value it cannot take (a `ValueError`).
        """
        if options and self.options_class is None and type(self).__init__ is Adapter.__init__:
            raise AdapterOptionsError(
                f"The {self.name!r} adapter takes no options; got adapter_options={dict(options)!r}. "
                "Remove them, or select the adapter they belong to."
            )
        self.emulate = emulate
        self.options: dict[str, Any] = dict(options or {})
        self._vendor: ModuleType | None = None
        self.config: Any = None if self.options_class is None else self.options_class.from_env(overrides=options)
        """The parsed `options_class` (None without one)."""

    # ---- discovery -------------------------------------------------------------------
    def data_parallel_type(self, use_distributed: bool) -> DistributedType:
        """`DistributedType` of a data-parallel run (DDP or the adapter's own): NO for one process."""
        return DistributedType[self.data_parallel_name] if use_distributed else DistributedType.NO

    @classmethod
    def availability_probes(cls) -> dict[str, Any]:
        """Accelerate's `is_<hardware>_available` functions for this hardware, by name (e.g.
        `{"is_<device>_available": ...}`), served by `accel.utils`. The core names no hardware, so
        these come only from adapters; a name no adapter provides answers False."""
        return {}

    @classmethod
    def availability(cls) -> Availability:
        """Can this adapter run on this machine (without emulation)? Must be cheap and never raise."""
        return Availability(available=True)

    # ---- device and backend ----------------------------------------------------------
    @property
    def device_type(self) -> str:
        return "cpu" if self.emulate else self.hardware_device_type

    @property
    def backend(self) -> str:
        return "gloo" if self.emulate else self.hardware_backend

    @property
    def vendor(self) -> ModuleType:
        """The module of vendor calls, or its stand-in under emulation (imported on first use)."""
        if self._vendor is None:
            path = self.emulated_vendor_module if self.emulate else self.vendor_module
            if path is None:
                raise NotImplementedError(f"adapter {self.name!r} declares no vendor module")
            try:
                self._vendor = importlib.import_module(path)
            except ImportError as exc:
                # availability() said yes (or emulation was asked for), yet the vendor stack does
                # not import: say which adapter and what failed, not a bare ImportError.
                from ..errors import AdapterUnavailableError

                raise AdapterUnavailableError(
                    f"The {self.name!r} adapter cannot load its vendor module {path!r}: {type(exc).__name__}: {exc}. "
                    f"Reinstall the adapter's vendor stack (`pip install {type(self).__module__.split('.')[0].replace('_', '-')}` "
                    "and its requirements), or select another adapter."
                ) from exc
        return self._vendor

    def device_for(self, local_rank: int) -> torch.device:
        """The device a process with this local rank uses."""
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, local_rank)

    def ddp_device_ids(self, device: torch.device) -> list[int] | None:
        """`device_ids` for DistributedDataParallel: None on CPU, the device index otherwise."""
        return None if device.type == "cpu" or device.index is None else [device.index]

    def set_device(self, device: torch.device) -> None:
        """Make `device` current before the process group starts (e.g. a `set_device` call)."""

    def before_process_group(self, device: torch.device) -> None:
        """Runs once, after `set_device` and right before `init_process_group` (e.g. importing the
        vendor module that registers the device and its backend with torch). Not run when the user
        started the process group already."""

    def after_process_group(self) -> None:
        """Runs on every process once the default process group is up (a new one, or one the script started),
        in the same order everywhere: build the adapter's own process groups here (`dist.new_group`).
        Default: nothing."""

    def data_parallel_group(self) -> Any:
        """The group of processes that hold different data when the adapter's own parallelism has several
        processes share one batch (e.g. sequence parallelism: a sequence's chunks on several processes). The core
        shards prepared loaders, gathers and reduces over the strategy's `data_parallel_group` first, else over
        this one. Default: None (every process holds its own data)."""
        return None

    def accelerator_attributes(self) -> dict[str, Any]:
        """Names this adapter adds to its `Accelerator` (read when the Accelerator has no such member), e.g. the
        vendor's parallel-state object its model code expects. Default: none."""
        return {}

    def context_parallel_kernels(self) -> contextlib.AbstractContextManager[Any]:
        """Entered around torch's `context_parallel` in `Accelerator.maybe_context_parallel`: an adapter whose
        attention kernels torch's context-parallel ring does not dispatch (an emulated device running the host's
        kernel in place of the device's) registers them for the block. Default: nothing."""
        return contextlib.nullcontext()

    def process_group_options(self, device: torch.device) -> dict[str, Any]:
        """Extra keyword arguments for `torch.distributed.init_process_group` (e.g. `pg_options` for the
        backend, `device_id=device` for eager initialisation). Default: none."""
        return {}

    def barrier(self) -> None:
        """Block until every process reaches this point (`wait_for_everyone`). Default: `dist.barrier()`;
        an adapter whose backend's barrier does not block replaces it with its runtime's own."""
        dist.barrier()

    def empty_cache(self) -> None:
        """Release cached device memory (`free_memory`). Default: the vendor module's `empty_cache()`
        when it has one."""
        self._forward("empty_cache")

    def _forward(self, name: str, *args: Any) -> Any:
        """`self.vendor.<name>(*args)` when the adapter declares a vendor module that has `name`; else None.

        The device-call defaults (`empty_cache`, `manual_seed`, `get_device_rng_state`,
        `set_device_rng_state`) go through here, so a vendor module exposing `empty_cache`,
        `manual_seed`, `get_rng_state` and `set_rng_state` needs no adapter code for them."""
        if (self.emulated_vendor_module if self.emulate else self.vendor_module) is None:
            return None
        function = getattr(self.vendor, name, None)
        return None if function is None else function(*args)

    # ---- random state ------------------------------------------------------------------
    def get_rng_state(self) -> dict[str, Any]:
        """RNG state of every generator this process uses, for checkpoints."""
        np_state: tuple[Any, ...] = np.random.get_state(legacy=True)  # type: ignore[assignment]
        return {
            "python": random.getstate(),
            "numpy": {
                "kind": np_state[0],
                "keys": torch.from_numpy(np.asarray(np_state[1]).astype(np.int64)),
                "pos": int(np_state[2]),
                "has_gauss": int(np_state[3]),
                "cached_gaussian": float(np_state[4]),
            },
            "torch": torch.get_rng_state(),
            "device": self.get_device_rng_state(),
        }

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `get_rng_state` returned (`load_state`, resume). Base: Python, NumPy and torch's
        CPU generator; an adapter with device generators restores them too, exactly."""
        random.setstate(_to_tuple(state["python"]))
        n = state["numpy"]
        np.random.set_state(
            (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
        )
        torch.set_rng_state(state["torch"])
        if state.get("device") is not None:
            self.set_device_rng_state(state["device"])

    def get_device_rng_state(self) -> Any:
        """RNG state of the device generators: the vendor module's `get_rng_state()` when it has one,
        else None (the device has none of its own)."""
        return self._forward("get_rng_state")

    def set_device_rng_state(self, state: Any) -> None:
        """Restore `get_device_rng_state`'s result (the vendor module's `set_rng_state(state)`); None is skipped."""
        if state is not None:
            self._forward("set_rng_state", state)

    def manual_seed(self, seed: int) -> None:
        """Seed the device generators (the host ones are seeded by `set_seed`): the vendor module's
        `manual_seed(seed)` when it has one."""
        self._forward("manual_seed", seed)

    # ---- precision ----------------------------------------------------------------------
    precision_class: ClassVar[type[Precision] | None] = None
    """The run's precision object (`accel.precision.Precision` or a subclass: an fp8 recipe, a
    vendor scaler); None: the core's, built from `autocast`, `make_grad_scaler` and `optimizer_step`."""

    def supports_precision(self, precision: str) -> bool:
        """Whether `mixed_precision=precision` can run here (checked when the Accelerator is built and by
        `accel launch`). Base: `precision in capabilities.precisions`."""
        return precision in self.capabilities.precisions

    def precision_fallback(self, precision: str) -> tuple[str, str] | None:
        """The mode to run instead of `precision`, and the warning that says why, when this device lacks what
        the adapter needs for it (fp8 on a generation without fp8 units: Accelerate warns and trains in a
        16-bit mode); None: run `precision`. Asked once, when the Accelerator's precision is resolved.
        Base: None."""
        return None

    def autocast(
        self, precision: str, *, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """A context running ops in `precision` ("bf16"/"fp16"); a null context for "no"."""
        if precision not in ("bf16", "fp16") or not enabled:
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16
        kwargs: dict[str, Any] = {"device_type": self.device_type, "dtype": dtype}
        if cache_enabled is not None:
            kwargs["cache_enabled"] = cache_enabled
        return torch.autocast(**kwargs)

    def make_grad_scaler(self, precision: str, **kwargs: Any) -> torch.amp.GradScaler | None:
        """Loss scaler for `precision` (fp16 needs one), or None."""
        if precision != "fp16":
            return None
        return torch.amp.GradScaler(self.device_type, **kwargs)

    # ---- prepare ----------------------------------------------------------------------
    # The core walks each model through `accel.prepare.walk`: `places_model` -> `place_model` ->
    # `optimize_model` -> the precision's `convert_module` -> the strategy -> compilation with the
    # backend the adapter names. The adapter answers; it never calls a strategy.
    repoints_paired_optimizers: ClassVar[bool] = False
    """True when `optimize_model` makes the optimizers in `ctx.optimizers` train the model's new
    parameters itself (a vendor that optimizes a model together with its optimizer, like
    a vendor `optimize(model, optimizer)` call); the core then leaves those optimizers as the adapter left them."""

    def before_prepare(self, objects: list[Any], ctx: RunContext) -> None:
        """Runs once per `prepare` call, after the strategy's `validate_prepare` and before anything is
        placed, with the objects as given (already prepared ones included); `ctx` carries the
        Accelerator's default `device_placement` and no `optimizers`. For what concerns the whole call:
        refusing a combination, a vendor setting a kwargs handler asks for, data-loader options to set
        before sharding. Default: nothing."""

    def after_prepare(self, prepared: list[Any], ctx: RunContext) -> None:
        """Runs once per `prepare` call at its end, with the prepared objects in the caller's order (models
        as the walk returned them, `AcceleratedOptimizer`, `AcceleratedScheduler`, `DataLoaderShard`).
        For tweaks of prepared objects and per-call clean-up. Default: nothing."""

    def places_model(self, ctx: RunContext) -> bool:
        """Whether the walk moves the model being prepared onto `ctx.device` (with `place_model`). Base:
        `ctx.device_placement` (the call's request, else the Accelerator's default); hardware whose own
        rule differs (e.g. no move in multi-process training unless asked) answers it here."""
        return ctx.device_placement

    def place_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """Move the model onto `ctx.device` (when `places_model` says so). Base: `model.to(ctx.device)`; a
        device that needs its own move (memory formats, lazy devices, tied weights) overrides it."""
        return model.to(ctx.device)

    def optimize_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """The vendor's own optimisation of the placed model, before precision and the strategy (e.g. a
        vendor `optimize(model, optimizer)` with the model's optimizers in `ctx.optimizers`; set
        `repoints_paired_optimizers` when it re-points them). Runs in evaluation mode too
        (`ctx.evaluation_mode`). Base: the model unchanged."""
        return model

    def check_strategy(self, strategy_name: str) -> None:
        """Refuse a strategy this hardware's options rule out (raise ValueError saying what to do), once,
        when the Accelerator picks it; a strategy missing from `capabilities.strategies` is refused by the
        core already. Base: nothing."""

    compile_backends: ClassVar[frozenset[str] | None] = None
    """The `torch.compile` backends this hardware runs (None: any). The walk refuses another backend by
    name, naming the adapter; `Capabilities.compile=False` refuses compilation altogether."""

    def dynamo_settings(self, plugin: TorchDynamoPlugin | None) -> TorchDynamoPlugin | None:
        """The compile settings this hardware applies for the user's `plugin` (None: no compilation).
        Read by the walk and by strategies that compile their own engine. Base: `plugin` as is; an
        adapter whose option implies compilation (e.g. regional compilation) returns adjusted settings."""
        return plugin

    def compile_regions(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """Regional compilation (`TorchDynamoPlugin.use_regional_compilation`) of a prepared model, with
        `torch.compile`'s `kwargs`, where the strategy does not compile in place. Base: Accelerate's
        (`accel.utils.compile_regions`: a copy in which each repeated block and every other subtree is
        compiled); an adapter whose users expect another rule replaces it."""
        from ..prepare.wrappers import compile_regions

        return compile_regions(model, **kwargs)

    def compiled_autograd(self) -> bool:
        """Whether a strategy that compiles its own engine (DeepSpeed's `engine.compile`) also compiles the
        backward with compiled autograd. Base: False."""
        return False

    def compile_backend(self) -> str:
        """The torch.compile backend for this hardware when the user asks for the default one."""
        return "inductor"

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: RunContext) -> torch.optim.Optimizer:
        """Hook for optimizers (e.g. fused vendor versions), after the core re-pointed it at its model's
        placed parameters and before the strategy sees it. Default: unchanged."""
        return optimizer

    def prepare_data_loader_kwargs(self, ctx: RunContext) -> dict[str, Any]:
        """Extra options for prepared data loaders (e.g. pin_memory, a worker start method), for the loader in
        `ctx.data_loader` (the user's, to read). Default: none.

        `batch_transfer`: a callable `(batches, device) -> iterable` that places this rank's
        batches on the device itself (e.g. a device loader prefetching in the background);
        the loader then skips its own per-batch move.
        """
        return {}

    # ---- the step ---------------------------------------------------------------------
    def after_backward(self) -> None:
        """Runs after each backward (e.g. a lazy-mode step marker)."""

    def has_own_optimizer_step(self) -> bool:
        """Whether this adapter replaces `optimizer_step` (then the fp16 scaler steps through it too)."""
        return type(self).optimizer_step is not Adapter.optimizer_step

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> Any:
        """Step the optimizer (from `AcceleratedOptimizer.step`, on the steps that sync; under fp16 the
        precision's grad scaler calls it after unscaling, so a vendor step composes with scaling).
        Base: `optimizer.step(closure)`."""
        return optimizer.step(closure) if closure is not None else optimizer.step()

    def after_optimizer_step(self) -> None:
        """Runs after each real optimizer step (e.g. a lazy-mode step marker)."""

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip gradients to `max_norm` and return the total norm, from `Accelerator.clip_grad_norm_`
        when the strategy does not clip itself (gradients are unscaled first). Base: torch's
        `clip_grad_norm_`; a vendor's fused clip goes here."""
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    # ---- strategies -----------------------------------------------------------------------
    strategy_aliases: ClassVar[Mapping[str, str]] = {}
    """Strategy names this adapter implements its own way, e.g. `{"ddp": "<device>_ddp"}`: a
    script or config file that asks for "ddp" gets the hardware's data parallelism."""

    def default_strategy(self) -> str:
        """The strategy used when the user names none (`Accelerator(strategy=...)`, `ACCEL_STRATEGY`);
        it must be one of `capabilities.strategies`."""
        return "ddp"

    def strategy_defaults(self, strategy_name: str) -> dict[str, Any]:
        """Defaults this hardware's users expect from the strategy `strategy_name`, in that
        strategy's own config format (e.g. a DeepSpeed config dict for "deepspeed").

        The strategy applies them below everything the user sets (config, plugin, Accelerator):
        they only fill values nobody chose. Default: none.
        """
        return {}

    # ---- launch -------------------------------------------------------------------------
    visible_devices_env: ClassVar[str | None] = None
    """The variable that limits which devices this hardware's processes see (its runtime renumbers them from
    0). `accel launch --gpu_ids 0,2` (or a config file's `gpu_ids`) sets it for the workers, as `accelerate
    launch` does; "all" sets nothing. None: `--gpu_ids` is refused naming the adapter."""

    @classmethod
    def add_launch_arguments(cls, parser: argparse._ArgumentGroup) -> None:
        """Add this adapter's own `accel launch` flags to its argument group (default: `options_class`'s)."""
        if cls.options_class is not None:
            cls.options_class.add_launch_arguments(parser)

    @classmethod
    def launch_env(cls, args: argparse.Namespace) -> dict[str, str]:
        """Environment variables for the workers, from this adapter's launch flags (default: `options_class`'s)."""
        return {} if cls.options_class is None else cls.options_class.launch_env(args)

    def describe(self) -> str:
        """One line for `accel env` and logs: the adapter, whether it is emulated, its device type and backend."""
        mode = " (emulated on cpu)" if self.emulate else ""
        return f"{self.name}{mode}: device={self.device_type} backend={self.backend}"


def _to_tuple(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_to_tuple(v) for v in value)
    return value
