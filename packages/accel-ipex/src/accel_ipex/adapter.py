"""`IpexAdapter`: Intel CPUs (and XPUs) under accel, with intel-extension-for-pytorch.

Every IPEX call goes through `self.vendor` (`accel_ipex.ipex`). IPEX runs for real on a CPU, so
its stand-in (`accel_ipex.ipex_emulated`) keeps the IPEX calls and replaces only `torch.xpu` and the
backend probes; emulation changes the device (`cpu`) and the backend (`gloo`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from accel.adapter.base import Adapter, Availability, Capabilities
from accel.distributed.distributed_type import DistributedType
from accel.errors import SettingError
from torch.nn.parallel import DistributedDataParallel

from .cpu_features import bf16_prepack_supported, choose_weights_prepack, cpu_flags
from .options import OPTIMIZE_DEST, IpexOptions, add_accelerate_ipex_flag, ipex_config_settings
from .versions import IpexVersionError, check_pair, installed_ipex_version, installed_torch_version, torch_has_xccl

if TYPE_CHECKING:
    from accel.prepare.context import RunContext


class IpexAdapter(Adapter):
    """Intel CPUs with gloo (or oneCCL's `ccl` when its bindings are installed), Intel XPUs with
    `xccl`/`ccl`; `ipex.optimize` on every prepared model before the strategy wraps it; bf16
    autocast with fp32 master weights; fp16 refused.
    """

    name: ClassVar[str] = "ipex"
    # Above the built-in cpu adapter (0): with IPEX installed and matching torch, Intel's
    # kernels are what the user asked for. Below GPU adapters, which own their devices.
    priority: ClassVar[int] = 20
    hardware_device_type: ClassVar[str] = "cpu"
    hardware_backend: ClassVar[str] = "gloo"
    capabilities: ClassVar[Capabilities] = Capabilities(
        # fp16: IPEX's CPU training path has no loss-scaled fp16 master weights (and this
        # CPU's kernels would emulate fp16); bf16 has fp32's range and needs no scaler.
        precisions=frozenset({"no", "bf16"}),
        # FSDP2 would shard parameters that IPEX has swapped for prepacked/bf16 ones (see the README).
        strategies=frozenset({"ddp"}),
        # torch.compile over the ipex.optimize'd model: IPEX's own dynamo backend ("ipex", Accelerate's
        # DynamoBackend.IPEX, the default here) or inductor; numbers equal to eager (tests/test_compile.py).
        compile=True,
        multi_process=True,
    )
    vendor_module: ClassVar[str] = "accel_ipex.ipex"
    # Real IPEX on the CPU; torch.xpu and the backend probes stood in (an emulated XPU host, no XPU by default).
    emulated_vendor_module: ClassVar[str] = "accel_ipex.ipex_emulated"
    options_class: ClassVar[type[IpexOptions]] = IpexOptions
    # Accelerate (before it dropped IPEX) read ACCELERATE_USE_IPEX=false as "do not ipex.optimize";
    # `accelerate launch` set it from --ipex / ipex_config.
    accelerate_env: ClassVar[Mapping[str, str]] = {"ACCELERATE_USE_IPEX": "ACCEL_IPEX_OPTIMIZE"}
    config: IpexOptions
    """The parsed options (launch flags / `ACCEL_IPEX_*`, then `Accelerator(adapter_options=...)`)."""

    def __init__(self, *, emulate: bool = False, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(emulate=emulate, options=options)
        self._optimized: list[torch.optim.Optimizer] = []

    # ---- discovery, device and backend ------------------------------------------------------
    @classmethod
    def availability_probes(cls) -> dict[str, Any]:
        """`accel.utils.is_ipex_available`, `is_xpu_available`, `is_ccl_available` (oneCCL's bindings importable)
        and `is_xccl_available` (torch >= 2.7 with `xccl`), as Accelerate's."""

        def is_ipex_available() -> bool:
            return importlib.util.find_spec("intel_extension_for_pytorch") is not None

        def is_xpu_available(check_device: bool = False) -> bool:
            xpu = getattr(torch, "xpu", None)
            return bool(xpu is not None and xpu.is_available() and (not check_device or xpu.device_count() > 0))

        def is_ccl_available() -> bool:
            return importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None

        return {
            "is_ipex_available": is_ipex_available,
            "is_xpu_available": is_xpu_available,
            "is_ccl_available": is_ccl_available,
            "is_xccl_available": torch_has_xccl,
        }

    @classmethod
    def availability(cls) -> Availability:
        version = installed_ipex_version()
        if version is None:
            return Availability(available=False, reason="intel-extension-for-pytorch is not installed")
        try:
            check_pair(installed_torch_version(), version)
        except (IpexVersionError, ValueError) as exc:
            return Availability(available=False, reason=str(exc))
        flags = cpu_flags()
        prepack = "unknown" if not flags else "yes" if bf16_prepack_supported(flags) else "no"
        return Availability(
            available=True, reason=f"intel-extension-for-pytorch {version}; CPU can prepack bf16 weights: {prepack}"
        )

    @property
    def on_xpu(self) -> bool:
        """Whether this process runs on an Intel XPU (`torch.xpu.is_available()`; under emulation, whether the
        emulated host has XPUs: `ACCEL_IPEX_EMULATED_XPUS`, none by default)."""
        return bool(self.vendor.is_available())

    @property
    def device_type(self) -> str:
        if self.emulate:
            return super().device_type
        return "xpu" if self.on_xpu else "cpu"

    def data_parallel_type(self, use_distributed: bool) -> DistributedType:
        """Accelerate's names: MULTI_XPU for several processes on Intel GPUs, MULTI_CPU on CPUs."""
        if use_distributed and self.on_xpu:
            return DistributedType.MULTI_XPU
        return super().data_parallel_type(use_distributed)

    @property
    def backend(self) -> str:
        if self.emulate:
            return super().backend
        return self.collective_backend()

    def collective_backend(self) -> str:
        """The backend Accelerate's IPEX integration chose (its state.py, before IPEX was removed): on XPUs
        torch's `xccl` when this torch has it (>= 2.7); otherwise, with several processes, oneCCL's `ccl` when
        its bindings import and either `CCL_WORKER_COUNT` > 0 or the processes run on XPUs, else `mpi` when
        torch was built with it, else `gloo`. (Accelerate 1.15 dropped the `ccl` branch: `mpi`, else `gloo`.)

        Raises:
            SettingError: `CCL_WORKER_COUNT` is not a whole number.
        """
        xpu = self.on_xpu
        if xpu and self.vendor.is_xccl_available():
            return "xccl"
        if (xpu or _ccl_worker_count() > 0) and self.vendor.ccl_available():
            return "ccl"
        return "mpi" if self.vendor.is_mpi_available() else "gloo"

    def set_device(self, device: torch.device) -> None:
        if device.type == "xpu":
            self.vendor.set_device(device)

    def empty_cache(self) -> None:
        """`torch.xpu.empty_cache()` through the vendor module (which has nothing to release on a CPU)."""
        self.vendor.empty_cache()

    def memory_stats(self, device: torch.device | None = None) -> dict[str, Any]:
        """`torch.xpu.memory_stats(device)` on an XPU; `{}` on a CPU."""
        return self.vendor.memory_stats(device) if self.on_xpu else {}  # type: ignore[no-any-return]

    def get_device_rng_state(self) -> Any:
        return self.vendor.get_rng_state_all() if self.on_xpu else None

    def set_device_rng_state(self, state: Any) -> None:
        if state is not None and self.on_xpu:
            self.vendor.set_rng_state_all(state)

    def manual_seed(self, seed: int) -> None:
        if self.on_xpu:
            self.vendor.manual_seed_all(seed)

    compile_backends: ClassVar[frozenset[str] | None] = frozenset({"ipex", "inductor"})

    def compile_backend(self) -> str:
        """IPEX's dynamo backend (registered by `import intel_extension_for_pytorch`)."""
        return "ipex"

    # ---- launch: Accelerate's --ipex and ipex_config ---------------------------------------------
    @classmethod
    def add_launch_arguments(cls, parser: argparse._ArgumentGroup) -> None:
        """The options' flags, and Accelerate's `--ipex` (this adapter, with ipex.optimize on)."""
        super().add_launch_arguments(parser)
        add_accelerate_ipex_flag(parser)

    @classmethod
    def launch_env(cls, args: argparse.Namespace) -> dict[str, str]:
        """The options' variables from the flags; one filled from a config file's `ipex_config` yields to the same
        variable already set in the environment (as the core's settings do)."""
        env = super().launch_env(args)
        if getattr(args, "accelerate_ipex", None) and getattr(args, OPTIMIZE_DEST, None) is None:
            env["ACCEL_IPEX_OPTIMIZE"] = "1"  # --ipex; an explicit --[no-]ipex-optimize wins
        if OPTIMIZE_DEST in getattr(args, "from_file", ()) and "ACCEL_IPEX_OPTIMIZE" in os.environ:
            env.pop("ACCEL_IPEX_OPTIMIZE", None)
        return env

    @classmethod
    def accelerate_config_settings(cls, key: str, value: Any) -> dict[str, Any] | None:
        """Accelerate's `ipex_config: {ipex: true|false}` (written by `accelerate config` on CPUs and XPUs)."""
        return ipex_config_settings(value) if key == "ipex_config" else None

    # ---- what ipex.optimize is asked for --------------------------------------------------------
    def weights_prepack(self, mixed_precision: str) -> bool:
        """`weights_prepack` for a model prepared under `mixed_precision`: the option when set, else
        what this CPU supports (IPEX asserts on bf16 prepacking without avx_ne_convert or AVX-512)."""
        low = mixed_precision == "bf16"
        supported = low and self.bf16_prepack_supported()
        return choose_weights_prepack(low_precision=low, override=self.config.weights_prepack, bf16_supported=supported)

    def bf16_prepack_supported(self) -> bool:
        """Whether this CPU can prepack bf16 weights, by the very check IPEX asserts with."""
        return bool(self.vendor.bf16_prepack_supported())

    # ---- prepare ----------------------------------------------------------------------------
    # ipex.optimize re-points (and re-keys, and fuses) the optimizer it is given.
    repoints_paired_optimizers = True

    def after_prepare(self, prepared: list[Any], ctx: RunContext) -> None:
        self._optimized = []

    def optimize_model(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """`ipex.optimize` (with the `optimize` option on), after placement and before precision and the
        strategy: run on a DDP-wrapped model, it swaps the parameters DDP all-reduces and the replicas drift
        apart without an error. In distributed training rank 0's weights are broadcast before it, too: under
        bf16 IPEX splits each fp32 master into the bf16 parameter and a low half it keeps aside, and DDP's own
        broadcast at wrap time reaches only the bf16 halves, so replicas started from different weights would
        keep different masters.

        Raises:
            ValueError: a model that is already DistributedDataParallel; two optimizers holding
                parameters of one model, or one optimizer holding parameters of two models, in
                the same `prepare` call.
            RuntimeError: weights_prepack forced on for bf16 on a CPU that cannot prepack bf16.
        """
        if isinstance(model, DistributedDataParallel):
            raise ValueError(
                "The ipex adapter applies ipex.optimize before wrapping the model in DistributedDataParallel; "
                "optimizing inside an existing DDP wrapper lets the replicas drift apart. Pass the plain module "
                "to `prepare` (accel wraps it)."
            )
        if not self.config.optimize:
            return model
        if ctx.use_distributed and not ctx.evaluation_mode and model.training:
            _broadcast_from_rank0(model)
        return self.optimize(model, ctx)

    def optimize(self, model: torch.nn.Module, ctx: RunContext) -> torch.nn.Module:
        """`ipex.optimize` for `model`: inference when preparing for evaluation (or the model is in
        eval mode), else training together with its optimizer from the same `prepare` call, which
        IPEX re-keys and fuses in place. A training model without its optimizer is
        left as it is, with a warning: IPEX cannot optimize it alone."""
        dtype = torch.bfloat16 if ctx.mixed_precision == "bf16" else None
        level = self.config.level
        # At O0 IPEX prepacks nothing; an explicit weights_prepack would override that, so only the user's does.
        prepack = self.weights_prepack(ctx.mixed_precision) if level == "O1" else self.config.weights_prepack
        options = {"weights_prepack": prepack, "level": level, **self.config.optimize_kwargs()}
        if dtype is not None and prepack and not self.on_xpu and not self.bf16_prepack_supported():
            raise RuntimeError(
                "weights_prepack is forced on, but this CPU cannot prepack bf16 weights (it needs avx_ne_convert "
                "or avx512bw/avx512vl/avx512dq). Drop the override (ACCEL_IPEX_WEIGHTS_PREPACK / "
                "--ipex-weights-prepack) to let the adapter decide, or set it to off."
            )
        if ctx.evaluation_mode or not model.training:
            return self.vendor.optimize_for_inference(model, dtype=dtype, **options)  # type: ignore[no-any-return]
        optimizer = self._optimizer_of(model, ctx)
        if optimizer is None:
            warnings.warn(
                "The ipex adapter prepares a model in training mode without its optimizer, so ipex.optimize is "
                "skipped for it (IPEX optimizes a training model only together with its optimizer). Pass the model "
                "and its optimizer in the same `accelerator.prepare(model, optimizer, ...)` call.",
                stacklevel=7,  # the user's prepare call: optimize, optimize_model and the walk's four frames
            )
            return model
        model, _ = self.vendor.optimize_for_training(model, optimizer, dtype=dtype, **options)
        return model

    def _optimizer_of(self, model: torch.nn.Module, ctx: RunContext) -> torch.optim.Optimizer | None:
        # The core pairs them by parameter identity, before anything was prepared: ctx.optimizers
        # held this model's parameters. IPEX re-points and fuses an optimizer for one model only:
        # a second model sharing it would train through a step IPEX never prepared for it.
        if any(o in self._optimized for o in ctx.optimizers):
            raise ValueError(
                "One optimizer holds parameters of two models in this `prepare` call; ipex.optimize pairs one model "
                "with one optimizer. Give each model its own optimizer, or wrap the models in one nn.Module."
            )
        owners = list(ctx.optimizers)
        if len(owners) > 1:
            raise ValueError(
                f"{len(owners)} optimizers in this `prepare` call hold parameters of the same model; ipex.optimize "
                "takes one optimizer per model. Combine them into one optimizer with several param groups."
            )
        if not owners:
            return None
        self._optimized.append(owners[0])
        return owners[0]

    def describe(self) -> str:
        c = self.config
        prepack = "auto" if c.weights_prepack is None else c.weights_prepack
        more = "".join(f" {name}={value}" for name, value in c.optimize_kwargs().items())
        return f"{super().describe()} optimize={c.optimize} level={c.level} weights_prepack={prepack}{more}"


def _ccl_worker_count() -> int:
    raw = os.environ.get("CCL_WORKER_COUNT", "").strip()
    if not raw:
        return 0
    try:
        return int(raw)
    except ValueError:
        raise SettingError(
            "CCL_WORKER_COUNT",
            f"must be a whole number (oneCCL's worker threads per process), got {raw!r}; set it to e.g. 1, or unset it.",
        ) from None


def _broadcast_from_rank0(model: torch.nn.Module) -> None:
    # Once per prepare, not per step: the same cost as DDP's own start-up broadcast.
    import torch.distributed as dist

    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=0)
