"""The CPU stand-in for `accel_cuda.cuda`: same functions, no GPU.

Device-only calls (set_device, empty_cache, TF32 switches) are counted or
recorded in `calls` / `tf32`, so tests can assert where the adapter makes them. The
emulated GPUs' random generators are real `torch.Generator`s, so checkpoints carry and
restore their state as they do on hardware. fp8 stands for TransformerEngine and torchao
with `accel.precision.fp8_emulation` (real fp8 rounding, per-tensor scales).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from accel.precision import fp8_emulation as f8
from accel.testing.emulated import DeviceGenerators, device_count_from_env

COMPILE_BACKEND = "inductor"
"""The same default as on a GPU; inductor generates C++ for the CPU instead of Triton."""

calls: Counter[str] = Counter()
"""How many times each device-only call was made (reset it between tests)."""
current_device: list[int] = []
"""Indices passed to `set_device`, in order."""
group_started_at_set_device: list[bool] = []
"""For each `set_device` call, whether a process group already existed (it must not, for NCCL)."""
tf32 = {"matmul": False, "cudnn": True}
"""The emulated TF32 switches, starting at PyTorch's defaults."""
machine: dict[str, Any] = {
    "gpus": [n for n in os.environ.get("ACCEL_CUDA_EMULATED_GPUS", "").split(",") if n],
    "driver": os.environ.get("ACCEL_CUDA_EMULATED_DRIVER", "550.54.14"),
}
"""What nvidia-smi reports for the emulated machine: no GPUs by name unless a test says so (or, for a
launch, `ACCEL_CUDA_EMULATED_GPUS` lists their names, comma-separated, and `ACCEL_CUDA_EMULATED_DRIVER`
the driver version)."""
installed_fp8_backends: set[str] = {"te", "ao"}
"""Which fp8 libraries the emulated machine has; tests remove them to reach the errors."""


def is_available() -> bool:
    return True


def device_count() -> int:
    """As many emulated GPUs as CUDA_VISIBLE_DEVICES lists, else one per local process."""
    return device_count_from_env("CUDA_VISIBLE_DEVICES")


def device_name(index: int) -> str:
    return f"emulated GPU {index}"


def machine_gpus() -> tuple[list[str], str]:
    return list(machine["gpus"]), str(machine["driver"])


def set_device(index: int) -> None:
    calls["set_device"] += 1
    current_device.append(index)
    group_started_at_set_device.append(torch.distributed.is_available() and torch.distributed.is_initialized())


def empty_cache() -> None:
    calls["empty_cache"] += 1


_rng = DeviceGenerators(lambda: device_count())


def generator(index: int = 0) -> torch.Generator:
    """Emulated GPU `index`'s generator (tests draw from it as CUDA code draws from the GPU's)."""
    return _rng.generator(index)


def get_rng_state() -> list[torch.Tensor]:
    return _rng.get_rng_state()


def set_rng_state(states: list[torch.Tensor]) -> None:
    _rng.set_rng_state(states)


def manual_seed(seed: int) -> None:
    _rng.manual_seed(seed)


def is_bf16_supported() -> bool:
    return True


def can_pin_memory() -> bool:
    # Pinning needs an accelerator runtime; without one torch raises, so the stand-in says no.
    return False


def set_tf32(matmul: bool | None, cudnn: bool | None) -> None:
    calls["set_tf32"] += 1
    if matmul is not None:
        tf32["matmul"] = matmul
    if cudnn is not None:
        tf32["cudnn"] = cudnn


def tf32_state() -> tuple[bool, bool]:
    return tf32["matmul"], tf32["cudnn"]


# ---- fp8: stands for transformer_engine.pytorch and torchao.float8 --------------------------

mxfp8 = {"supported": True}
"""Whether the emulated GPU has MXFP8 block scaling (a Blackwell); tests turn it off to reach the refusal."""
fsdp_scale_precomputes: Counter[int] = Counter()
"""How many times `ao_precompute_fsdp_scales` ran, by id of the model."""


def fp8_hardware_supported() -> tuple[bool, str]:
    return True, "emulated GPU (fp8 emulated in fp32 with fp8 rounding)"


def mxfp8_supported() -> tuple[bool, str]:
    return mxfp8["supported"], "" if mxfp8["supported"] else "the emulated GPU stands for one before Blackwell"


def has_transformer_engine() -> bool:
    return "te" in installed_fp8_backends


def has_torchao() -> bool:
    return "ao" in installed_fp8_backends


@dataclass(kw_only=True, frozen=True)
class TERecipe(f8.Float8Recipe):
    """Stands for TransformerEngine's `DelayedScaling` / `MXFP8BlockScaling`. MXFP8 computes each block's
    scale from the tensor itself, emulated as dynamic per-tensor scaling; `override_linear_precision` is
    recorded as the vendor recipe holds it."""

    override_linear_precision: tuple[bool, bool, bool] = (False, False, False)
    block_scaling: bool = False


def te_recipe(
    *,
    fp8_format: str,
    margin: int,
    interval: int,
    amax_history_len: int,
    amax_compute_algo: str,
    override_linear_precision: tuple[bool, bool, bool],
    use_mxfp8_block_scaling: bool,
) -> TERecipe:
    if use_mxfp8_block_scaling:
        return TERecipe(fp8_format=fp8_format, scaling="dynamic", margin=margin, block_scaling=True)
    return TERecipe(
        fp8_format=fp8_format,
        scaling="delayed",
        margin=margin,
        interval=interval,
        amax_history_len=amax_history_len,
        amax_compute_algo=amax_compute_algo,
        override_linear_precision=override_linear_precision,
    )


class TELinear(f8.Float8Linear):
    """Stands for `te.Linear`: fp8 inside `te_fp8_autocast`, full precision outside."""


def te_linear(linear: torch.nn.Linear) -> torch.nn.Module:
    return TELinear(linear)


def is_te_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, TELinear)


def te_fp8_autocast(recipe: f8.Float8Recipe) -> Any:
    return f8.fp8_autocast(recipe)


@dataclass(kw_only=True, frozen=True)
class Float8LinearConfig:
    """Stands for `torchao.float8.Float8LinearConfig` (tensorwise dynamic scaling, its default)."""

    fp8_format: str = "HYBRID"
    pad_inner_dim: bool = False
    enable_fsdp_float8_all_gather: bool = False


def ao_config(*, pad_inner_dim: bool, enable_fsdp_float8_all_gather: bool) -> Float8LinearConfig:
    return Float8LinearConfig(pad_inner_dim=pad_inner_dim, enable_fsdp_float8_all_gather=enable_fsdp_float8_all_gather)


class AOFloat8Linear(f8.Float8Linear):
    """Stands for torchao's `Float8Linear`: always fp8, dynamic per-tensor scaling. Without `pad_inner_dim`
    an inner dimension that is not a multiple of 16 fails in the forward, as `torch._scaled_mm` does."""

    def __init__(self, linear: torch.nn.Linear, *, recipe: f8.Float8Recipe, pad_inner_dim: bool) -> None:
        super().__init__(linear, recipe=recipe)
        self.pad_inner_dim = pad_inner_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.pad_inner_dim and self.in_features % 16:
            raise RuntimeError(
                f"Expected trailing dimension of mat1 to be divisible by 16 but got mat1 shape: "
                f"({x.shape[0]}x{self.in_features}) (emulated torch._scaled_mm; pad_inner_dim pads it)"
            )
        return super().forward(x)


def ao_convert(
    model: torch.nn.Module, config: Any, module_filter_fn: Callable[[torch.nn.Module, str], bool]
) -> torch.nn.Module:
    config = config if config is not None else Float8LinearConfig()
    recipe = f8.Float8Recipe(fp8_format=getattr(config, "fp8_format", "HYBRID"), scaling="dynamic")
    pad = bool(getattr(config, "pad_inner_dim", False))
    f8.swap_linears(model, lambda linear: AOFloat8Linear(linear, recipe=recipe, pad_inner_dim=pad), module_filter_fn)
    return model


def ao_precompute_fsdp_scales(model: torch.nn.Module) -> None:
    fsdp_scale_precomputes[id(model)] += 1


def is_ao_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, AOFloat8Linear)


# ---- context parallelism: the host's attention kernel in the ring, in place of the GPU's ---------------------
def context_parallel_kernels() -> Any:
    """Stands for the GPU's flash-attention kernel inside torch's context-parallel ring: on the emulated GPU,
    `scaled_dot_product_attention` runs the host's flash kernel, which torch's ring does not dispatch, so for the
    block its forward and backward go through torch's own ring algorithm (`_templated_ring_attention`, load
    balancing and rotation as on a GPU) with the host kernel computing each chunk. Counted in
    `calls["ring_attention"]` / `calls["ring_attention_backward"]`."""
    import contextlib

    from torch.distributed.tensor.experimental._context_parallel import _attention as ring

    aten = torch.ops.aten
    forward, backward = (
        aten._scaled_dot_product_flash_attention_for_cpu.default,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
    )

    def chunk_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kw: Any) -> Any:
        return forward(query, key, value, kw.get("dropout_p", 0.0), kw.get("is_causal", False), scale=kw.get("scale"))

    def chunk_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kw: Any) -> Any:
        return backward(
            kw["grad_out"],
            query,
            key,
            value,
            kw["out"],
            kw["logsumexp"],
            kw.get("dropout_p", 0.0),
            kw["is_causal"],
            scale=kw.get("scale"),
        )

    def on_forward(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls["ring_attention"] += 1
        q, k, v = args[:3]
        dropout_p = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
        is_causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
        out, lse = ring._templated_ring_attention(
            q.device_mesh.get_group(),
            2,
            chunk_forward,
            q.to_local(),
            k.to_local(),
            v.to_local(),
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=kwargs.get("scale"),
        )[:2]
        return tuple(_like(t, q) for t in (out, lse))

    def on_backward(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        calls["ring_attention_backward"] += 1
        grad_out, q, k, v, out, lse, dropout_p, is_causal = args[:8]
        grads = ring._templated_ring_attention_backward(
            q.device_mesh.get_group(),
            2,
            chunk_backward,
            grad_out=grad_out.to_local(),
            grad_out_name="grad_out",
            query=q.to_local(),
            key=k.to_local(),
            value=v.to_local(),
            out=out.to_local(),
            logsumexp=lse.to_local(),
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=kwargs.get("scale"),
        )[:3]
        return tuple(_like(g, q) for g in grads)

    @contextlib.contextmanager
    def registered() -> Any:
        handlers = {forward: on_forward, backward: on_backward}
        ring.custom_ops.update(handlers)
        try:
            yield
        finally:
            for op in handlers:
                ring.custom_ops.pop(op, None)

    return registered()


def _like(local: torch.Tensor, reference: Any) -> Any:
    """`local` as a DTensor split along the sequence (dim 2) like `reference`."""
    from torch.distributed.tensor import DTensor, Shard

    return DTensor.from_local(local, reference.device_mesh, [Shard(2)], run_check=False)
