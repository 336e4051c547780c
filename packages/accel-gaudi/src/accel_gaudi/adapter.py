"""`GaudiAdapter`: Intel Gaudi (HPU) under accel, the way Gaudi's own stack prepares models.

Every Habana call goes through `self.vendor` (`accel_gaudi.hpu`, or `accel_gaudi.hpu_emulated`
under emulation); the decisions here are the same either way.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import multiprocessing
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.adapter.base import Adapter, Availability, Capabilities
from accel.adapter.options import AdapterOptionsError
from accel.errors import CompileNotSupportedError

from .autocast_ops import declared_lists, same_lists, write_op_lists
from .options import GaudiOptions
from .parallel_state import SequenceParallelState
from .precision import GaudiPrecision

if TYPE_CHECKING:
    from accel.prepare.context import RunContext
    from accel.settings.kwargs import TorchDynamoPlugin


OPTIMUM_HABANA_VERSION = "1.19.0"
"""The optimum-habana release whose `GaudiAccelerator` this adapter follows (and later ones up to 1.20): from
1.19 on it delegates `prepare_model` to Accelerate, which places the model on the device whenever
`device_placement` is True (the default), in multi-HPU training too (optimum-habana commit 9e82d818d)."""

SPAWN_WORKERS_ABOVE = 8
"""World sizes above this get `spawn` data-loader workers (Gaudi's `WORLD_SIZE > 8` rule)."""

DEEPSPEED_GRADIENT_CLIPPING = 1.0
"""The `gradient_clipping` Gaudi users get under DeepSpeed when they set none (filled by Gaudi's
Accelerator, as by Accelerate; DeepSpeed's own default is 0, no clipping)."""


GAUDI1_NAMES = ("GAUDI", "GAUDI1")
"""How `device_name` reports a first-generation Gaudi."""


class GaudiAdapter(Adapter):
    """Gaudi HPUs with the hccl backend; bf16 autocast, fp8 through Habana's transformer engine,
    lazy-mode step markers, `ddp` or `fast_ddp` data parallelism, FSDP2, and `hpu_backend` compilation.
    """

    name: ClassVar[str] = "gaudi"
    priority: ClassVar[int] = 60
    hardware_device_type: ClassVar[str] = "hpu"
    hardware_backend: ClassVar[str] = "hccl"
    data_parallel_name: ClassVar[str] = "MULTI_HPU"
    capabilities: ClassVar[Capabilities] = Capabilities(
        # fp16 is refused on Gaudi (its own Accelerator does the same): bf16 has the range.
        precisions=frozenset({"no", "bf16", "fp8"}),
        strategies=frozenset({"ddp", "fast_ddp", "fsdp2", "deepspeed"}),
        compile=True,
        multi_process=True,
        parallelism=frozenset({"tp", "hsdp"}),
    )
    vendor_module: ClassVar[str] = "accel_gaudi.hpu"
    emulated_vendor_module: ClassVar[str] = "accel_gaudi.hpu_emulated"
    visible_devices_env: ClassVar[str | None] = "HABANA_VISIBLE_MODULES"
    """`accel launch --gpu_ids 0,2` limits the workers to those Gaudi modules, as `accelerate launch` does on HPU."""
    options_class: ClassVar[type[GaudiOptions]] = GaudiOptions
    precision_class = GaudiPrecision
    """bf16 autocast by `force_autocast`/`autocast_policy`, fp8 through Habana's transformer engine."""
    config: GaudiOptions
    """The parsed options (launch flags / `ACCEL_GAUDI_*`, then `Accelerator(adapter_options=...)`)."""

    def __init__(self, *, emulate: bool = False, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(emulate=emulate, options=options)
        self._lazy: bool | None = None
        self._declare_autocast_ops()
        self.parallel_state = SequenceParallelState(self.config.context_parallel_size)
        """optimum-habana's `parallel_state` for this run, also `accelerator.mpu` (groups once the process group
        is up, with `context_parallel_size` above 1)."""

    # ---- context parallelism (optimum-habana's sequence-parallel groups) ------------------------------------
    def after_process_group(self) -> None:
        """`context_parallel_size` > 1: build the sequence- and data-parallel groups (every process)."""
        if self.config.context_parallel_size > 1:
            self.parallel_state.build()

    def data_parallel_group(self) -> Any:
        """Under `context_parallel_size` > 1 the processes of one sequence-parallel group share each batch:
        loaders, gathers and reductions run over the data-parallel group, as optimum-habana's
        `prepare_data_loader` divides the processes by the sequence-parallel size."""
        if self.parallel_state.sequence_parallel_is_initialized():
            return self.parallel_state.get_data_parallel_group()
        return None

    def accelerator_attributes(self) -> dict[str, Any]:
        """`accelerator.mpu`: optimum-habana's `GaudiAccelerator.mpu` (its `parallel_state`)."""
        return {"mpu": self.parallel_state}

    def _declare_autocast_ops(self) -> None:
        """optimum-habana's `declare_autocast_bf16_fp32_ops`: with both `autocast_bf16_ops` and
        `autocast_fp32_ops`, the lists are written to files and `PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST` /
        `PT_HPU_AUTOCAST_FP32_OPS_LIST` name them, before Habana's autocast reads them. Lists already declared
        (by `accel launch`, or an earlier Accelerator) are left as they are.

        Raises:
            AdapterOptionsError: other lists than the ones the bridge has already read (it reads them once: on
                Gaudi when it loads, which happens before the adapter is built unless `accel launch` passed them).
        """
        lists = self.config.autocast_op_lists
        if lists is None or same_lists(declared_lists(os.environ), lists):
            return
        if self.vendor.autocast_lists_loaded():
            raise AdapterOptionsError(
                "autocast_bf16_ops / autocast_fp32_ops come too late: Habana's bridge has already read its autocast "
                "op lists in this process. Pass them to `accel launch --autocast-bf16-ops ... --autocast-fp32-ops ...` "
                "(or set PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST to files listing "
                "them before the process starts)."
            )
        os.environ.update(write_op_lists(*lists))

    @classmethod
    def launch_env(cls, args: argparse.Namespace) -> dict[str, str]:
        """The options' variables for the workers; with both autocast op lists, also the files that declare
        them to Habana's bridge (`PT_HPU_AUTOCAST_*_OPS_LIST`), written by the launcher so that the workers
        have them before the bridge loads."""
        env = super().launch_env(args)
        lists = GaudiOptions.from_env(env).autocast_op_lists
        if lists is not None:
            env.update(write_op_lists(*lists))
        return env

    def autocast(
        self, precision: str, *, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """Habana's autocast (`torch.autocast("hpu")`, which applies the declared op lists) through the vendor
        module; a null context for "no"."""
        context = super().autocast(precision, enabled=enabled, cache_enabled=cache_enabled)
        if isinstance(context, contextlib.nullcontext):
            return context
        return self.vendor.autocast(context)  # type: ignore[no-any-return]

    # ---- discovery and device -----------------------------------------------------------
    @classmethod
    def availability_probes(cls) -> dict[str, Any]:
        """`accel.utils.is_hpu_available`: Habana's stack imports and sees a Gaudi (Accelerate's
        `init_hccl` argument is accepted and ignored: accel starts the process group itself)."""
        return {"is_hpu_available": lambda init_hccl=False: bool(cls.availability())}

    @classmethod
    def availability(cls) -> Availability:
        if importlib.util.find_spec("habana_frameworks") is None:
            return Availability(available=False, reason="habana_frameworks is not installed (no Gaudi software stack)")
        try:
            from . import hpu
        except Exception as exc:  # a half-installed stack is "not available", with the reason
            return Availability(available=False, reason=f"importing habana_frameworks failed: {exc}")
        if not hpu.is_available():
            return Availability(available=False, reason="habana_frameworks is installed but sees no HPU")
        return Availability(available=True, reason=f"{hpu.device_count()} HPU(s)")

    def device_for(self, local_rank: int) -> torch.device:
        # One HPU per process: the runtime binds each process to its module, so the device
        # carries no index (as Gaudi's own state does).
        return torch.device("cpu") if self.emulate else torch.device("hpu")

    def ddp_device_ids(self, device: torch.device) -> list[int] | None:
        return None

    def set_device(self, device: torch.device) -> None:
        # hccl exists for torch.distributed only once Habana's module registers it, which
        # must happen before the process group starts.
        self.vendor.init_distributed()

    @property
    def lazy(self) -> bool:
        """Whether the bridge runs in lazy mode, where `mark_step` launches the accumulated graph."""
        if self._lazy is None:
            self._lazy = bool(self.vendor.is_lazy())
        return self._lazy

    # ---- prepare --------------------------------------------------------------------------
    def optimize_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """`use_hpu_graphs_for_training`: a model prepared for training is wrapped in Habana's `ModuleCacher`
        (in place, before precision and the strategy, once), as optimum-habana's Trainer wraps it before
        `prepare`; evaluation-mode preparation leaves it alone, as there."""
        if not self.config.use_hpu_graphs_for_training or ctx.evaluation_mode:
            return model
        if model.__dict__.get("_accel_hpu_graphs_for_training"):
            return model
        model = self.vendor.module_cacher(model)
        model.__dict__["_accel_hpu_graphs_for_training"] = True
        return model

    def precision_fallback(self, precision: str) -> tuple[str, str] | None:
        """`mixed_precision="fp8"` on Gaudi1 (no fp8 units): bf16, with Accelerate's warning, as Accelerate does."""
        if precision == "fp8" and self.vendor.device_name() in GAUDI1_NAMES:
            return "bf16", (
                "The current HPU device is Gaudi1 which does not support FP8 mixed precision training (requires "
                "Gaudi2 or higher). Will use BF16 instead."
            )
        return None

    def check_fp8_supported(self) -> None:
        """Gaudi1 has no fp8 units (Gaudi's stack refuses fp8 there too).

        Raises:
            ValueError: on a first-generation Gaudi.
        """
        name = self.vendor.device_name()
        if name in GAUDI1_NAMES:
            raise ValueError(
                f"fp8 needs Gaudi2 or later; this device is {name} (Gaudi1). Use mixed_precision='bf16' "
                "and drop --fp8 / ACCEL_GAUDI_FP8."
            )

    def check_strategy(self, strategy_name: str) -> None:
        """`distribution_strategy='fast_ddp'` replaces DDP: it runs with the 'fast_ddp' strategy only;
        `context_parallel_size` > 1 runs with ddp or fast_ddp.

        Raises:
            ValueError: the option is set and the Accelerator runs another strategy.
        """
        if self.config.context_parallel_size > 1 and not self.parallel_state.sequence_parallel_is_initialized():
            raise ValueError(
                f"context_parallel_size={self.config.context_parallel_size} splits each sequence over that many "
                "processes, but this run has no process group: launch it with `accel launch --num_processes N` "
                "(N a multiple of the size), or drop --context-parallel-size."
            )
        if self.config.context_parallel_size > 1 and strategy_name not in ("ddp", "fast_ddp"):
            raise ValueError(
                f"context_parallel_size={self.config.context_parallel_size} builds optimum-habana's sequence-parallel "
                f"groups for the ddp and fast_ddp strategies; this Accelerator uses {strategy_name!r}. Use ddp, or "
                "ParallelismConfig for FSDP2's own dimensions."
            )
        if self.config.distribution_strategy == "fast_ddp" and strategy_name != "fast_ddp":
            raise ValueError(
                f"distribution_strategy='fast_ddp' replaces DDP and runs as the 'fast_ddp' strategy; this Accelerator "
                f"uses {strategy_name!r}. Drop --distribution-strategy fast_ddp (ACCEL_GAUDI_DISTRIBUTION_STRATEGY), "
                "or leave the strategy unset."
            )

    def dynamo_settings(self, plugin: TorchDynamoPlugin | None) -> TorchDynamoPlugin | None:
        """`use_regional_compilation` implies compilation (the adapter's backend unless the user chose one),
        one repeated block at a time; otherwise the user's settings as they are. DeepSpeed's engine is
        compiled with the same settings (`engine.compile`, after `deepspeed.initialize`).

        A run that compiles is refused in lazy mode (optimum-habana: "Dynamo and lazy are mutually
        exclusive"), and gets the dynamo knobs of the options (`cache_size_limit`, `inline_inbuilt_nn_modules`,
        `allow_unspec_int_on_nn_module`) set in `torch._dynamo.config`, as optimum-habana's training arguments do.

        Raises:
            CompileNotSupportedError: compilation in lazy mode (`PT_HPU_LAZY_MODE` not 0), or a knob this
                torch cannot honour.
        """
        settings = plugin
        if self.config.use_regional_compilation:
            backend = plugin.backend if plugin is not None and plugin.backend not in (None, "no") else "default"
            if plugin is None:
                from accel.settings.kwargs import TorchDynamoPlugin

                plugin = TorchDynamoPlugin(backend=backend)
            settings = dataclasses.replace(plugin, backend=backend, use_regional_compilation=True)
        if settings is not None and settings.backend not in (None, "no"):
            self._check_compile_mode(settings.backend)
            self._apply_dynamo_knobs()
        return settings

    def _check_compile_mode(self, backend: str) -> None:
        if self.lazy:
            raise CompileNotSupportedError(
                f"Dynamo and lazy are mutually exclusive: torch.compile (dynamo_backend={backend!r}) runs on Gaudi "
                "only in eager mode. Set PT_HPU_LAZY_MODE=0 before the process starts (Habana's bridge reads it when "
                "it loads), or drop dynamo_backend / --use-regional-compilation."
            )

    def _apply_dynamo_knobs(self) -> None:
        """The options' dynamo knobs into `torch._dynamo.config` (process-wide, as optimum-habana sets them)."""
        import torch._dynamo.config as dynamo_config

        knobs = {
            "cache_size_limit": self.config.cache_size_limit,
            "inline_inbuilt_nn_modules": self.config.inline_inbuilt_nn_modules,
            "allow_unspec_int_on_nn_module": self.config.allow_unspec_int_on_nn_module,
        }
        for name, value in knobs.items():
            if value is None:
                continue
            entry = getattr(dynamo_config, "_config", {}).get(name)
            fixed = entry is None or bool(getattr(entry, "deprecated", False))
            if fixed and name == "inline_inbuilt_nn_modules" and value:
                continue  # this torch always inlines torch's own modules: what was asked for
            if fixed:
                raise CompileNotSupportedError(
                    f"{name}={value!r}: torch {torch.__version__} no longer has this dynamo setting "
                    f"({getattr(entry, 'deprecation_message', '') or 'removed'}); drop the Gaudi option {name}."
                )
            setattr(dynamo_config, name, value)

    def prepare_data_loader_kwargs(self, ctx: RunContext) -> dict[str, Any]:
        """Gaudi's workaround for worker crashes in multi-node runs (Habana issue SW-207456): on more than
        `SPAWN_WORKERS_ABOVE` processes, a data loader with worker processes and no multiprocessing context of
        its own gets `spawn` workers, whether it reaches `prepare` or `prepare_data_loader` (the user's loader is
        left as it is; optimum-habana sets the context on it, and replaces one the loader had)."""
        loader = ctx.data_loader
        if (
            ctx.num_processes > SPAWN_WORKERS_ABOVE
            and loader is not None
            and loader.num_workers > 0
            and loader.multiprocessing_context is None
        ):
            return {"multiprocessing_context": multiprocessing.get_context("spawn")}
        return {}

    def compile_regions(self, model: torch.nn.Module, **kwargs: Any) -> torch.nn.Module:
        """Regional compilation as this adapter has always done it: each child of every `ModuleList` compiled
        in place, the rest of the model eager, the model itself returned (the whole model when it has no
        `ModuleList`)."""
        from accel.prepare.wrappers import is_compiled_module

        found = False
        for module in model.modules():
            if isinstance(module, torch.nn.ModuleList):
                for i, block in enumerate(module):
                    found = True
                    if not is_compiled_module(block):
                        module[i] = torch.compile(block, **kwargs)  # type: ignore[assignment]
        return model if found else torch.compile(model, **kwargs)  # type: ignore[return-value]

    def compile_backend(self) -> str:
        return self.vendor.COMPILE_BACKEND  # type: ignore[no-any-return]

    def compiled_autograd(self) -> bool:
        """The `compiled_autograd_enabled` option: DeepSpeed's `engine.compile` also compiles the backward."""
        return bool(self.config.compiled_autograd_enabled)

    # ---- the step -------------------------------------------------------------------------
    def after_backward(self) -> None:
        if self.lazy:
            self.vendor.mark_step()

    def after_optimizer_step(self) -> None:
        if self.lazy:
            self.vendor.mark_step()

    # ---- strategies -----------------------------------------------------------------------
    def default_strategy(self) -> str:
        """`fast_ddp` when Gaudi's `distribution_strategy` option asks for it, else `ddp`."""
        return "fast_ddp" if self.config.distribution_strategy == "fast_ddp" else "ddp"

    def strategy_defaults(self, strategy_name: str) -> dict[str, Any]:
        """fast_ddp: reduce in the vendor module's `ALLREDUCE_DTYPE` (bf16 on HPU), packing and unpacking the
        gradients through recorded HPU graphs (`hpu_graph`).

        DeepSpeed: sets `DEEPSPEED_USE_HPU=true` (unless set) for Habana's DeepSpeed fork; clips the
        global gradient norm at 1.0 unless the user sets `gradient_clipping` (Gaudi's own
        Accelerator fills 1.0, as Accelerate does; DeepSpeed's own default is 0, no clipping); the
        config, `DeepSpeedPlugin(gradient_clipping=...)` and the Accelerator all take precedence."""
        if strategy_name == "deepspeed":
            # Read by Habana's DeepSpeed fork when it initialises (after this, before `deepspeed.initialize`).
            os.environ.setdefault("DEEPSPEED_USE_HPU", "true")
            return {"gradient_clipping": DEEPSPEED_GRADIENT_CLIPPING}
        if strategy_name == "fast_ddp":
            # Packing and unpacking recorded as HPU graphs, as Gaudi's `all_reduce_gradients(use_hpu_graphs=True)`
            # (optimum-habana's Trainer always asks for them under fast_ddp).
            return {"allreduce_dtype": self.vendor.ALLREDUCE_DTYPE, "capture": self.vendor.hpu_graph}
        return {}

    # ---- Habana's fused optimizer and clip norm -------------------------------------------------
    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: RunContext) -> torch.optim.Optimizer:
        """A plain `torch.optim.AdamW` becomes Habana's `FusedAdamW` (same update, one fused
        kernel) when the vendor module has it and `fused_optimizers` is on; the replacement
        takes over the param groups (hyper-parameters included) and any state. AdamW with
        `amsgrad`, `maximize`, `capturable` or `differentiable` is kept (the fused one lacks them).

        Under DeepSpeed with optimizer offload, where the strategy replaces a torch optimizer by
        DeepSpeed's CPU optimizer (`DeepSpeedPlugin.maps_client_optimizer`), the optimizer is kept
        as it is for that mapping, and lazy mode is refused as Accelerate refuses it on HPU.

        Raises:
            ValueError: optimizer offload with a torch optimizer in lazy mode (`PT_HPU_LAZY_MODE=1`).
        """
        if ctx.optimizer_on_host:
            if self.lazy:
                raise ValueError(
                    "You can't use an Offload Optimizer with HPU in Lazy Mode. "
                    "Please set the environment variable `PT_HPU_LAZY_MODE` to `0`."
                )
            return optimizer
        fused_adamw, _ = self.vendor.fused_optimizers()
        if fused_adamw is None or not self.config.fused_optimizers or type(optimizer) is not torch.optim.AdamW:
            return optimizer
        if any(
            g.get(k) for g in optimizer.param_groups for k in ("amsgrad", "maximize", "capturable", "differentiable")
        ):
            return optimizer
        groups = [dict(g) for g in optimizer.param_groups if g["params"]]
        hyper = ("lr", "betas", "eps", "weight_decay")
        fused = fused_adamw([{"params": g["params"], **{k: g[k] for k in hyper}} for g in groups])
        for group, old in zip(fused.param_groups, groups):
            group.update({k: v for k, v in old.items() if k not in group and k != "params"})
        for p, state in optimizer.state.items():
            fused.state[p] = state
        return fused  # type: ignore[no-any-return]

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Habana's `FusedClipNorm` for the 2-norm when the vendor module has it (and
        `fused_optimizers` is on); torch's `clip_grad_norm_` otherwise."""
        _, fused_clip = self.vendor.fused_optimizers()
        parameters = list(parameters)
        if fused_clip is None or not self.config.fused_optimizers or float(norm_type) != 2.0:
            return super().clip_grad_norm_(parameters, max_norm, norm_type)
        return fused_clip(parameters, max_norm).clip_norm(parameters)  # type: ignore[no-any-return]

    def describe(self) -> str:
        c = self.config
        return (
            f"{super().describe()} distribution_strategy={c.distribution_strategy} "
            f"regional_compilation={c.use_regional_compilation} force_autocast={c.force_autocast} "
            f"autocast_policy={c.autocast_policy} fp8={c.fp8}"
        )
