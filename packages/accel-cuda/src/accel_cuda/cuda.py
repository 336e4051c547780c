"""Every call this package makes into CUDA and NVIDIA's libraries, and nothing else.

The adapter reaches CUDA only through this module (`CUDAAdapter.vendor`); under emulation
`accel_cuda.cuda_emulated` replaces it function for function: keep the two in step.
TransformerEngine and torchao are imported lazily, only when fp8 asks for them.
"""

from __future__ import annotations

import importlib.util
import subprocess
from collections.abc import Callable
from typing import Any

import torch

COMPILE_BACKEND = "inductor"
"""torch.compile's default backend; on CUDA it generates Triton kernels."""


def is_available() -> bool:
    return bool(torch.cuda.is_available())


def device_count() -> int:
    """GPUs this process can see (CUDA_VISIBLE_DEVICES already applied by the driver)."""
    return int(torch.cuda.device_count())


def device_name(index: int) -> str:
    return str(torch.cuda.get_device_name(index))


def machine_gpus() -> tuple[list[str], str]:
    """Every GPU of this machine by name, and the driver version, from nvidia-smi: unlike torch it does not
    initialise CUDA (the launcher asks too) and ignores CUDA_VISIBLE_DEVICES, as NCCL's P2P does.
    ([], "") when nvidia-smi cannot tell."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return [], ""
    rows = [[part.strip() for part in line.split(",")] for line in out.strip().splitlines() if "," in line]
    return [row[0] for row in rows], rows[0][-1] if rows else ""


def set_device(index: int) -> None:
    torch.cuda.set_device(index)


def empty_cache() -> None:
    torch.cuda.empty_cache()


def get_rng_state() -> list[torch.Tensor]:
    """The generator state of every visible GPU (one tensor each)."""
    return list(torch.cuda.get_rng_state_all())


def set_rng_state(states: list[torch.Tensor]) -> None:
    torch.cuda.set_rng_state_all(states)


def manual_seed(seed: int) -> None:
    torch.cuda.manual_seed_all(seed)


def is_bf16_supported() -> bool:
    return bool(torch.cuda.is_bf16_supported())


def can_pin_memory() -> bool:
    """Page-locked host memory needs a CUDA context; with one, host-to-GPU copies can be asynchronous."""
    return True


def set_tf32(matmul: bool | None, cudnn: bool | None) -> None:
    """Allow TensorFloat-32 in matmuls and/or cuDNN convolutions (None leaves a switch as it is)."""
    if matmul is not None:
        torch.backends.cuda.matmul.allow_tf32 = matmul
    if cudnn is not None:
        torch.backends.cudnn.allow_tf32 = cudnn


def tf32_state() -> tuple[bool, bool]:
    return bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32)


# ---- fp8 ---------------------------------------------------------------------------------


def fp8_hardware_supported() -> tuple[bool, str]:
    """fp8 tensor cores exist from compute capability 8.9 (Ada) and 9.0 (Hopper) on."""
    major, minor = torch.cuda.get_device_capability()
    name = torch.cuda.get_device_name()
    return (major, minor) >= (8, 9), f"{name} (compute capability {major}.{minor})"


def has_transformer_engine() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None


def has_torchao() -> bool:
    return importlib.util.find_spec("torchao") is not None


def _te() -> Any:
    import transformer_engine.pytorch as te

    return te


def mxfp8_supported() -> tuple[bool, str]:
    """Whether TransformerEngine can run MXFP8 block scaling here (Blackwell), and why not."""
    try:
        from transformer_engine.pytorch.fp8 import check_mxfp8_support
    except ImportError:
        return False, "this TransformerEngine has no MXFP8 block scaling (it needs TransformerEngine 2.0 or newer)"
    ok, reason = check_mxfp8_support()
    return bool(ok), str(reason)


def te_recipe(
    *,
    fp8_format: str,
    margin: int,
    interval: int,
    amax_history_len: int,
    amax_compute_algo: str,
    override_linear_precision: tuple[bool, bool, bool],
    use_mxfp8_block_scaling: bool,
) -> Any:
    """A TransformerEngine recipe: `DelayedScaling`, or `MXFP8BlockScaling` (format and margin only)."""
    from transformer_engine.common import recipe

    fmt = getattr(recipe.Format, fp8_format)
    if use_mxfp8_block_scaling:
        return recipe.MXFP8BlockScaling(fp8_format=fmt, margin=margin)
    return recipe.DelayedScaling(
        fp8_format=fmt,
        margin=margin,
        interval=interval,
        amax_history_len=amax_history_len,
        amax_compute_algo=amax_compute_algo,
        override_linear_precision=override_linear_precision,
    )


def te_linear(linear: torch.nn.Linear) -> torch.nn.Module:
    """A `te.Linear` holding `linear`'s own weight and bias Parameters (optimizers keep working)."""
    module = _te().Linear(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        params_dtype=linear.weight.dtype,
        device=linear.weight.device,
    )
    module.weight = linear.weight
    if linear.bias is not None:
        module.bias = linear.bias
    return module


def is_te_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, _te().Linear)


def te_fp8_autocast(recipe: Any) -> Any:
    """Context in which TransformerEngine layers compute in fp8 with `recipe`."""
    return _te().fp8_autocast(enabled=True, fp8_recipe=recipe)


def ao_config(*, pad_inner_dim: bool, enable_fsdp_float8_all_gather: bool) -> Any:
    """torchao's `Float8LinearConfig` with Accelerate's two switches."""
    from torchao.float8 import Float8LinearConfig

    return Float8LinearConfig(pad_inner_dim=pad_inner_dim, enable_fsdp_float8_all_gather=enable_fsdp_float8_all_gather)


def ao_convert(
    model: torch.nn.Module, config: Any, module_filter_fn: Callable[[torch.nn.Module, str], bool]
) -> torch.nn.Module:
    """torchao's float8 training conversion (in place: Linears become `Float8Linear`, same Parameters)."""
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(model, config=config, module_filter_fn=module_filter_fn)


def ao_precompute_fsdp_scales(model: torch.nn.Module) -> None:
    """After an optimizer step under FSDP2 with fp8 all-gather: compute every weight's fp8 scale in one pass."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def is_ao_linear(module: torch.nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)


def context_parallel_kernels() -> Any:
    """Nothing to register: torch's context-parallel ring dispatches CUDA's flash, efficient and cuDNN attention
    kernels itself."""
    import contextlib

    return contextlib.nullcontext()
