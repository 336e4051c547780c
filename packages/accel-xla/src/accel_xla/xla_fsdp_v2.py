"""xla_fsdp_v2: torch_xla's SPMD fully sharded data parallelism (FSDPv2) as a strategy.

`Accelerator(strategy="xla_fsdp_v2")` on the xla adapter wraps each prepared model in
torch_xla's `SpmdFullyShardedDataParallel`: SPMD is turned on, every device of the host is one
virtual device, and each parameter is sharded along the "fsdp" axis of the global mesh (a mesh
of every device, axes ("fsdp", "model"), unless the script set one with
`torch_xla.distributed.spmd.set_global_mesh`). XLA's SPMD partitioner inserts the all-gathers
and reduce-scatters; gradients need no averaging by accel, and the optimizer step is a plain
step. It is what transformers' `fsdp_config={"xla": True, "xla_fsdp_v2": True}` selects.

SPMD runs one process per host: launch one process (`accel launch --num-processes 1`, or plain
`python`) per TPU VM. Several processes on one host are refused. torch_xla is reached only
through the adapter's vendor module; under emulation (no torch_xla) the strategy is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.strategies.base import Strategy

if TYPE_CHECKING:
    from accel.prepare.context import RunContext


SPMD_TOO_LATE = (
    "The xla_fsdp_v2 strategy needs torch_xla's SPMD mode on before the XLA runtime starts, and it has started "
    "without it. Select the strategy before the Accelerator exists: `accel launch --strategy xla_fsdp_v2`, "
    "ACCEL_STRATEGY=xla_fsdp_v2, or `torch_xla.runtime.use_spmd()` at the top of the script."
)


def _emulated() -> bool:
    from accel.state import PartialState

    state = PartialState._shared_state
    adapter = state.get("adapter") if isinstance(state, dict) else None
    return bool(getattr(adapter, "emulate", False))


class XLAFSDPv2Strategy(Strategy):
    """Parameters sharded over the host's XLA devices by torch_xla's SPMD partitioner (FSDPv2)."""

    name: ClassVar[str] = "xla_fsdp_v2"

    def __init__(self, config: Any = None) -> None:
        if config:
            raise ValueError(
                f"The xla_fsdp_v2 strategy takes no settings, got {config!r}. Set a mesh with an 'fsdp' axis "
                "through torch_xla.distributed.spmd.set_global_mesh before prepare to shape the sharding."
            )
        super().__init__(None)
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

    def wrap_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """The model in torch_xla's `SpmdFullyShardedDataParallel` over the global mesh.

        Raises:
            ValueError: not the xla adapter on torch_xla (emulation has no SPMD partitioner), or
                several processes on this host (SPMD drives every local device from one process).
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
        return vendor.fsdp_v2_wrap(model)  # type: ignore[no-any-return]

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self._vendor is not None and self._vendor.is_fsdp_v2(model):
            inner: torch.nn.Module = model.module  # type: ignore[assignment]
            return inner
        return model

    def is_wrapped(self, model: torch.nn.Module) -> bool:
        return self._vendor is not None and bool(self._vendor.is_fsdp_v2(model))
