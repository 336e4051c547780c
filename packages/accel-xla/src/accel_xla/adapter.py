"""`XLAAdapter`: torch_xla devices (TPUs; also torch_xla's CPU device) under accel.

Every torch_xla call goes through `self.vendor` (`accel_xla.xla`, or `accel_xla.xla_emulated`
under emulation); the decisions here are the same either way.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.adapter.base import Adapter, Availability, Capabilities
from accel.adapter.options import AdapterOptionsError
from accel.distributed.distributed_type import DistributedType
from accel.distributed.launch_env import read_launch_env
from accel.errors import DistributedSetupError
from accel.prepare.group import optimizer_params

from .options import DOWNCAST_ENV, PODS, XLALaunchOptions, add_accelerate_tpu_flags
from .repoint import first_device, retie, tied_groups
from .xla_ddp import XLADataParallelStrategy

if TYPE_CHECKING:
    from accel.prepare.context import RunContext
    from accel.settings.kwargs import TorchDynamoPlugin

DEVICE_MISMATCH = (
    "The model and the optimizer parameters are not on the same device, which probably means you created an "
    "optimizer around your model **before** putting on the device. Make sure the line model.to(device) is before "
    "the optimizer creation in your script or remove it entirely and use the flag default value for "
    "`device_placement` in your `Accelerator` to let it handle that part for you."
)


class XLAAdapter(Adapter):
    """XLA devices through torch_xla with the `xla` collective backend.

    What differs from the torch-native path: placement gives a model new Parameter objects,
    so optimizers are re-pointed after `prepare`; data parallelism is the `xla_ddp` strategy
    (`accel_xla.xla_ddp`: no DDP wrapper, gradients averaged by one XLA all-reduce traced into
    the step), the default here, and `xla_fsdp_v2` shards over SPMD; the graph is cut once per
    optimizer step with `torch_xla.sync()`; prepared loaders hand out batches through torch_xla's
    parallel device loader; bf16 only (fp16 is refused); torch.compile with `openxla` only.
    """

    name: ClassVar[str] = "xla"
    priority: ClassVar[int] = 50
    hardware_device_type: ClassVar[str] = "xla"
    hardware_backend: ClassVar[str] = "xla"
    data_parallel_name: ClassVar[str] = "XLA"
    # What `accelerate config` writes for a TPU (distributed_type XLA) besides the keys accel reads itself:
    # the pod launcher's settings. They mean nothing to `accel launch` on one host (ignored with one note),
    # except asking for the pod launcher itself.
    accelerate_config_keys: ClassVar[Mapping[str, str | None]] = {
        "tpu_use_sudo": None,
        "tpu_name": None,
        "tpu_zone": None,
        "tpu_env": None,
        "tpu_vm": None,
        "commands": None,
        "command_file": None,
        "tpu_use_cluster": PODS,
    }
    capabilities: ClassVar[Capabilities] = Capabilities(
        # XLA computes reduced precision in bf16; fp16 would need dynamic loss scaling,
        # which the XLA path does not do.
        precisions=frozenset({"no", "bf16"}),
        # "ddp" stays accepted for scripts and config files that name it: torch's DDP wrapper over
        # the `xla` process group (torch_xla supports it); `xla_ddp` is the native path.
        strategies=frozenset({"xla_ddp", "xla_fsdp_v2"}),
        # torch.compile through torch's `openxla` dynamo backend (the default here); inductor is refused by name.
        compile=True,
        multi_process=True,
    )
    # torch.load cannot restore storages tagged with an XLA device: optimizer state is
    # written from the host and placed back by the optimizer's load_state_dict.
    checkpoint_on_host: ClassVar[bool] = True
    vendor_module: ClassVar[str] = "accel_xla.xla"
    emulated_vendor_module: ClassVar[str] = "accel_xla.xla_emulated"

    accelerate_env: ClassVar[Mapping[str, str]] = {"ACCELERATE_DOWNCAST_BF16": DOWNCAST_ENV}

    @classmethod
    def accelerate_config_settings(cls, key: str, value: Any) -> dict[str, Any] | None:
        """An Accelerate config file's `downcast_bf16: true` is `--downcast_bf16`."""
        if key == "downcast_bf16" and str(value).lower() in ("true", "yes", "1"):
            return {"downcast_bf16": True}
        return None

    def data_parallel_type(self, use_distributed: bool) -> DistributedType:
        """XLA, for one process too: Accelerate reports XLA whenever it runs on an XLA device."""
        return DistributedType.XLA

    # ---- discovery and device -------------------------------------------------------------
    @classmethod
    def availability_probes(cls) -> dict[str, Any]:
        """`accel.utils.is_torch_xla_available(check_is_tpu, check_is_gpu)`, as Accelerate's."""

        def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
            if importlib.util.find_spec("torch_xla") is None:
                return False
            if not (check_is_tpu or check_is_gpu):
                return True
            device = os.environ.get("PJRT_DEVICE", "")
            return device == "TPU" if check_is_tpu else device in ("CUDA", "GPU")

        return {"is_torch_xla_available": is_torch_xla_available}

    @classmethod
    def availability(cls) -> Availability:
        # Cheap on purpose: importing torch_xla starts its runtime.
        if importlib.util.find_spec("torch_xla") is None:
            return Availability(available=False, reason="torch_xla is not installed")
        pjrt = os.environ.get("PJRT_DEVICE")
        if pjrt:
            return Availability(available=True, reason=f"PJRT_DEVICE={pjrt}")
        if Path("/dev/accel0").exists() or (Path("/dev/vfio").is_dir() and importlib.util.find_spec("libtpu")):
            return Availability(available=True, reason="TPU chips found")
        return Availability(
            available=False,
            reason="torch_xla is installed but no TPU was found and PJRT_DEVICE is not set "
            "(PJRT_DEVICE=CPU runs on torch_xla's CPU device)",
        )

    def device_for(self, local_rank: int) -> torch.device:
        # torch_xla binds each process to its device itself; the local rank is not an index here.
        if self.emulate:
            return torch.device("cpu")
        if os.environ.get("ACCEL_STRATEGY") == "xla_fsdp_v2":
            # torch_xla's SPMD mode must be on before its runtime starts, i.e. before this lookup.
            self.vendor.use_spmd()
        return self.vendor.device()  # type: ignore[no-any-return]

    def ddp_device_ids(self, device: torch.device) -> list[int] | None:
        return None

    def set_device(self, device: torch.device) -> None:
        """Register the `xla` backend before the process group starts.

        Raises:
            DistributedSetupError: several processes on torch_xla's CPU device, where each
                process is a world of one and gradients would silently not be averaged.
        """
        self.vendor.register_backend()
        launch = read_launch_env()
        if not self.emulate and launch.distributed and self.vendor.device_kind() == "CPU":
            raise DistributedSetupError(
                f"The launcher started {launch.world_size} processes, but on torch_xla's CPU device every process "
                "is its own world of one replica: gradients would not be averaged across them. Run one process on "
                "the CPU device, add --emulate to run the xla adapter's multi-process code on gloo, or run on TPUs."
            )

    def barrier(self) -> None:
        self.vendor.barrier()

    # ---- bf16 as Accelerate runs it on a TPU ------------------------------------------------------
    def bf16_storage(self) -> str | None:
        """The torch_xla variable that stores float32 tensors in bf16 for a bf16 run, or None (autocast).

        Accelerate on a TPU: `XLA_USE_BF16` (every float32 tensor kept in bf16), or `XLA_DOWNCAST_BF16`
        with `downcast_bf16`; no autocast either way. Elsewhere it autocasts, and so does accel, unless
        `downcast_bf16` asks for the downcast (honoured on every XLA device: it is a request, not a default).
        """
        if os.environ.get(DOWNCAST_ENV, "").lower() in ("1", "true", "yes", "on"):
            return "XLA_DOWNCAST_BF16"
        if not self.emulate and self.vendor.device_kind() == "TPU":
            return "XLA_USE_BF16"
        return None

    def precision_fallback(self, precision: str) -> tuple[str, str] | None:
        """Where bf16 is stored in bf16 (`bf16_storage`), set torch_xla's variable as Accelerate's state does
        when the run's precision is resolved, before the model reaches the device.

        Raises:
            AdapterOptionsError: `downcast_bf16` without `mixed_precision="bf16"` (Accelerate's rule).
        """
        storage = self.bf16_storage()
        if storage == "XLA_DOWNCAST_BF16" and precision != "bf16":
            raise AdapterOptionsError(
                f"Can only use `downcast_bf16` (--downcast_bf16, ACCELERATE_DOWNCAST_BF16) when using "
                f"`mixed_precision='bf16'`, not {precision!r}: set mixed_precision='bf16' or drop downcast_bf16."
            )
        if precision == "bf16" and storage is not None:
            os.environ["XLA_USE_BF16"] = "1" if storage == "XLA_USE_BF16" else "0"
            os.environ["XLA_DOWNCAST_BF16"] = "1" if storage == "XLA_DOWNCAST_BF16" else "0"
        return None

    def autocast(
        self, precision: str, *, enabled: bool = True, cache_enabled: bool | None = None
    ) -> contextlib.AbstractContextManager[Any]:
        """No autocast where bf16 is stored in bf16 (`bf16_storage`); torch's autocast on the device otherwise."""
        if precision == "bf16" and self.bf16_storage() is not None:
            return contextlib.nullcontext()
        return super().autocast(precision, enabled=enabled, cache_enabled=cache_enabled)

    def counters(self) -> dict[str, int]:
        """Graphs compiled and executed so far on this process (torch_xla's metrics)."""
        return self.vendor.counters()  # type: ignore[no-any-return]

    # ---- prepare ------------------------------------------------------------------------
    def before_prepare(self, objects: list[Any], ctx: RunContext) -> None:
        """Refuse a model and an optimizer that were already apart before placement.

        Raises:
            ValueError: a model and an optimizer passed together already on different
                devices (the optimizer was built around the model before it was moved by hand:
                its parameters are no longer the model's, and nothing can re-attach them).
        """
        models = [o for o in objects if isinstance(o, torch.nn.Module) and not getattr(o, "_is_accel_prepared", False)]
        optimizers = [_inner(o) for o in objects if isinstance(o, torch.optim.Optimizer)]
        model_device = next((d for d in (first_device(m.parameters()) for m in models) if d is not None), None)
        opt_device = next((d for d in (first_device(optimizer_params(o)) for o in optimizers) if d is not None), None)
        if model_device is not None and opt_device is not None and model_device != opt_device:
            raise ValueError(DEVICE_MISMATCH)

    def place_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """`model.to(device)`, with tied weights tied again (the move replaces each reference separately)."""
        groups = tied_groups(model)
        model = model.to(ctx.device)
        retie(model, groups)
        return model

    def prepare_data_loader_kwargs(self, ctx: RunContext) -> dict[str, Any]:
        # Batches reach the device through torch_xla's parallel loader (prefetched by a
        # background thread), not one `.to()` per batch; under SPMD each split over the "fsdp" axis.
        return {"batch_transfer": self.vendor.device_loader} if ctx.device_placement else {}

    # ---- torch.compile --------------------------------------------------------------------
    @property
    def compile_backends(self) -> frozenset[str]:  # type: ignore[override]
        """`openxla` only (XLA compiles the traced graphs; inductor's CPU/GPU kernels cannot run on an XLA
        device); under emulation its stand-in, torch's `aot_eager`."""
        return self.vendor.COMPILE_BACKENDS  # type: ignore[no-any-return]

    def compile_backend(self) -> str:
        """`openxla`: what `dynamo_backend="default"` (or `--dynamo_backend default`) compiles with."""
        return self.vendor.COMPILE_BACKEND  # type: ignore[no-any-return]

    def dynamo_settings(self, plugin: TorchDynamoPlugin | None) -> TorchDynamoPlugin | None:
        """The user's settings; under emulation `openxla` becomes its stand-in (torch_xla is not there)."""
        if self.emulate and plugin is not None and plugin.backend == "openxla":
            return dataclasses.replace(plugin, backend=self.vendor.COMPILE_BACKEND)
        return plugin

    # ---- the step -------------------------------------------------------------------------
    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> Any:
        """A plain step through the vendor module: the gradients were averaged already, by the xla_ddp
        strategy (after backward, before clipping, or in its `before_optimizer_step`) or by DDP's hooks."""
        return self.vendor.step_only(optimizer, closure)

    def after_optimizer_step(self) -> None:
        # The one graph cut of the step: forward, backward and update run as one graph,
        # compiled once for a fixed-shape loop.
        self.vendor.sync()

    # ---- strategies -----------------------------------------------------------------------
    # Scripts and config files say "ddp": on XLA that is xla_ddp, not torch's DDP wrapper.
    strategy_aliases: ClassVar[Mapping[str, str]] = {"ddp": "xla_ddp"}

    def default_strategy(self) -> str:
        """`xla_ddp`: data parallelism the XLA way, no DDP wrapper."""
        return XLADataParallelStrategy.name

    def strategy_defaults(self, strategy_name: str) -> dict[str, Any]:
        """xla_ddp and xla_fsdp_v2 reach torch_xla through this adapter's vendor module (its CPU stand-in under emulation)."""
        return {"vendor": self.vendor} if strategy_name in (XLADataParallelStrategy.name, "xla_fsdp_v2") else {}

    # ---- launch ---------------------------------------------------------------------------
    @classmethod
    def add_launch_arguments(cls, parser: argparse._ArgumentGroup) -> None:
        """`--pjrt-device`, `--xla-cpu-devices`, and Accelerate's TPU flags (`--tpu` selects this adapter)."""
        # Launch flags only: torch_xla, not the adapter, reads what they set (`options_class` stays None).
        XLALaunchOptions.add_launch_arguments(parser)
        add_accelerate_tpu_flags(parser)

    @classmethod
    def launch_env(cls, args: argparse.Namespace) -> dict[str, str]:
        return XLALaunchOptions.launch_env(args)

    def describe(self) -> str:
        kind = "CPU (emulated)" if self.emulate else self.vendor.device_kind()
        return f"{super().describe()} pjrt_device={kind}"


def _inner(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)
