"""Every call this package makes into CUDA and NVIDIA's libraries, and nothing else.

The adapter reaches CUDA only through this module (`CUDAAdapter.vendor`); under emulation
`accel_cuda.cuda_emulated` replaces it function for function: keep the two in step.
TransformerEngine and torchao are imported lazily, only when fp8 asks for them.
"""

from __future__ import annotations

import importlib.util
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


def te_recipe(*, fp8_format: str, margin: int, interval: int, amax_history_len: int, amax_compute_algo: str) -> Any:
    """A TransformerEngine `DelayedScaling` recipe (`fp8_format`: "HYBRID", "E4M3" or "E5M2")."""
    from transformer_engine.common import recipe

    return recipe.DelayedScaling(
        fp8_format=getattr(recipe.Format, fp8_format),
        margin=margin,
        interval=interval,
        amax_history_len=amax_history_len,
        amax_compute_algo=amax_compute_algo,
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


def ao_convert(
    model: torch.nn.Module, config: Any, module_filter_fn: Callable[[torch.nn.Module, str], bool]
) -> torch.nn.Module:
    """torchao's float8 training conversion (in place: Linears become `Float8Linear`, same Parameters)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    return convert_to_float8_training(
        model, config=config if config is not None else Float8LinearConfig(), module_filter_fn=module_filter_fn
    )


def is_ao_linear(module: torch.nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)
