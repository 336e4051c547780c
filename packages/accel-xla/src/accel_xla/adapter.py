"""`XLAAdapter`: torch_xla devices (TPUs; also torch_xla's CPU device) under accel.

Every torch_xla call goes through `self.vendor` (`accel_xla.xla`, or `accel_xla.xla_emulated`
under emulation); the decisions here are the same either way.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.adapter import Adapter, Availability, Capabilities
from accel.distributed_type import DistributedType
from accel.errors import DistributedSetupError
from accel.launch_env import read_launch_env
from accel.state import GradientState

from .options import XLALaunchOptions
from .repoint import ParameterRecord, first_device, optimizer_params, repoint, retie, tied_groups

if TYPE_CHECKING:
    from accel.prepare import PrepareContext

DEVICE_MISMATCH = (
    "The model and the optimizer parameters are not on the same device, which probably means you created an "
    "optimizer around your model **before** putting on the device. Make sure the line model.to(device) is before "
    "the optimizer creation in your script or remove it entirely and use the flag default value for "
    "`device_placement` in your `Accelerator` to let it handle that part for you."
)


class XLAAdapter(Adapter):
    """XLA devices through torch_xla with the `xla` collective backend.

    What differs from the torch-native path: placement gives a model new Parameter objects,
    so optimizers are re-pointed after `prepare`; there is no DDP wrapper (gradients are
    averaged across replicas by one XLA all-reduce traced into the step, and the graph is
    cut once per optimizer step with `torch_xla.sync()`); prepared loaders hand out batches
    through torch_xla's parallel device loader; bf16 only (fp16 is refused).
    """

    name: ClassVar[str] = "xla"
    priority: ClassVar[int] = 50
    hardware_device_type: ClassVar[str] = "xla"
    hardware_backend: ClassVar[str] = "xla"
    data_parallel_name: ClassVar[str] = "XLA"
    capabilities: ClassVar[Capabilities] = Capabilities(
        # XLA computes reduced precision in bf16; fp16 would need dynamic loss scaling,
        # which the XLA path does not do.
        precisions=frozenset({"no", "bf16"}),
        strategies=frozenset({"ddp"}),
        compile=False,
        multi_process=True,
    )
    # torch.load cannot restore storages tagged with an XLA device: optimizer state is
    # written from the host and placed back by the optimizer's load_state_dict.
    checkpoint_on_host: ClassVar[bool] = True
    vendor_module: ClassVar[str] = "accel_xla.xla"
    emulated_vendor_module: ClassVar[str] = "accel_xla.xla_emulated"

    def data_parallel_type(self, use_distributed: bool) -> DistributedType:
        """XLA, for one process too: Accelerate reports XLA whenever it runs on an XLA device."""
        return DistributedType.XLA

    def __init__(self, *, emulate: bool = False, options: Any = None) -> None:
        super().__init__(emulate=emulate, options=options)
        self._record = ParameterRecord()
        # Weak both ways: an old CPU parameter no optimizer holds any more must be freed (it is a
        # full host copy of the weights), and a dead entry must not match a reused id.
        self._moved: dict[int, tuple[weakref.ref[torch.Tensor], weakref.ref[torch.Tensor]]] = {}
        self._optimizers: weakref.WeakSet[torch.optim.Optimizer] = weakref.WeakSet()
        self._models: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self._no_sync_depth = 0
        self._gradients_reduced = False

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
        return torch.device("cpu") if self.emulate else self.vendor.device()  # type: ignore[no-any-return]

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

    def counters(self) -> dict[str, int]:
        """Graphs compiled and executed so far on this process (torch_xla's metrics)."""
        return self.vendor.counters()  # type: ignore[no-any-return]

    # ---- prepare ------------------------------------------------------------------------
    def before_prepare(self, objects: list[Any], ctx: PrepareContext) -> None:
        """Record each model's parameters by name before placement replaces them.

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
        for model in models:
            self._record.add(model)

    def place_model(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        """`model.to(device)`, with tied weights tied again (the move replaces each reference separately)."""
        groups = tied_groups(model)
        model = model.to(ctx.device)
        retie(model, groups)
        return model

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, ctx: PrepareContext) -> torch.optim.Optimizer:
        self._optimizers.add(optimizer)
        return optimizer

    def after_prepare(self, prepared: list[Any], ctx: PrepareContext) -> None:
        """Re-point every optimizer prepared so far at the parameters placement created."""
        for key, (old, new) in self._record.replacements().items():
            self._moved[key] = (weakref.ref(old), weakref.ref(new))
        self._record = ParameterRecord()
        live: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for key, (old_ref, new_ref) in list(self._moved.items()):
            old_param, new_param = old_ref(), new_ref()
            if old_param is None or new_param is None:
                del self._moved[key]
            else:
                live[key] = (old_param, new_param)
        if live:
            for optimizer in list(self._optimizers):
                repoint(optimizer, live)

    def apply_strategy(self, model: torch.nn.Module, ctx: PrepareContext) -> torch.nn.Module:
        """No DDP wrapper: replicas start from rank 0's weights; the adapter averages gradients itself.

        Other strategies are refused when the Accelerator is built (`Capabilities.strategies`).
        """
        if ctx.use_distributed:
            self.vendor.broadcast_master_params(model)
        self._models.add(model)
        return model

    def prepare_data_loader_kwargs(self, ctx: PrepareContext) -> dict[str, Any]:
        # Batches reach the device through torch_xla's parallel loader (prefetched by a
        # background thread), not one `.to()` per batch.
        return {"batch_transfer": self.vendor.device_loader} if ctx.device_placement else {}

    # ---- the step -------------------------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        self._no_sync_depth += 1
        try:
            yield
        finally:
            self._no_sync_depth -= 1

    def after_backward(self) -> None:
        """Average the prepared models' gradients across replicas after the backward that closes
        an accumulation window (not inside `no_sync`), so `.grad` reads as under DDP on every
        adapter. On XLA the all-reduce is traced into the step's graph: it costs what
        `xm.optimizer_step`'s own reduction costs, and the step then does not reduce again."""
        if self._no_sync_depth or not GradientState().sync_gradients:
            return
        self._reduce(p for model in self._models for p in model.parameters())

    def _reduce(self, params: Iterable[torch.Tensor]) -> None:
        grads = {id(p): p.grad for p in params if p.grad is not None}
        self.vendor.all_reduce_mean(list(grads.values()))
        self._gradients_reduced = True

    def clip_grad_norm_(
        self, parameters: Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        """Clip by the norm of the replica-averaged gradients (averaged here if backward did not)."""
        params = list(parameters)
        if GradientState().sync_gradients and not self._gradients_reduced:
            self._reduce(params)
        return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=norm_type)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Any = None) -> Any:
        """`xm.optimizer_step` (average, then step) unless the gradients were averaged already
        (after `accelerator.backward`, or before clipping)."""
        reduced, self._gradients_reduced = self._gradients_reduced, False
        if reduced:
            return self.vendor.step_only(optimizer, closure)
        return self.vendor.optimizer_step(optimizer, closure)

    def after_optimizer_step(self) -> None:
        # The one graph cut of the step: forward, backward and update run as one graph,
        # compiled once for a fixed-shape loop.
        self.vendor.sync()

    # ---- launch ---------------------------------------------------------------------------
    @classmethod
    def add_launch_arguments(cls, parser: argparse._ArgumentGroup) -> None:
        # Launch flags only: torch_xla, not the adapter, reads what they set (`options_class` stays None).
        XLALaunchOptions.add_launch_arguments(parser)

    @classmethod
    def launch_env(cls, args: argparse.Namespace) -> dict[str, str]:
        return XLALaunchOptions.launch_env(args)

    def describe(self) -> str:
        kind = "CPU (emulated)" if self.emulate else self.vendor.device_kind()
        return f"{super().describe()} pjrt_device={kind}"


def _inner(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    return getattr(optimizer, "optimizer", optimizer)
