"""Every call into intel-extension-for-pytorch, oneCCL's bindings and `torch.xpu`: the adapter's
one vendor module.

IPEX runs for real on a CPU, so the stand-in (`accel_ipex.ipex_emulated`) keeps this module's IPEX
calls and stands in only for `torch.xpu` and the collective-backend probes. Importing it checks the
IPEX/torch pair first, because IPEX's own check fails with an unhelpful error.
"""

from __future__ import annotations

import functools
import importlib
import types
from typing import Any

import torch

from .versions import check_pair, installed_ipex_version, installed_torch_version, torch_has_xccl

_version = installed_ipex_version()
if _version is None:
    raise ImportError(
        "intel-extension-for-pytorch is not installed; install it with `pip install accel-ipex[ipex]` "
        "(it needs the torch minor release it was built for)."
    )
check_pair(installed_torch_version(), _version)

import intel_extension_for_pytorch as ipex  # noqa: E402  (only after the version check above)
import intel_extension_for_pytorch._C as ipex_core  # noqa: E402

VERSION: str = ipex.__version__

# IPEX keeps the caller's objects when optimizing in place: the same Module (layers change
# class, e.g. to `_IPEXConv2d`), the same Parameter objects (their data prepacked or cast to
# bf16) and the same optimizer (its state re-keyed and its step fused), so references held by
# the user, the optimizer wrapper and schedulers stay valid. A copy (IPEX's default) hands back
# new objects and leaves every such reference on parameters nobody trains.
_INPLACE = True


def optimize_for_training(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    dtype: torch.dtype | None,
    inplace: bool = _INPLACE,
    **options: Any,
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """`ipex.optimize` of a model in training mode together with its optimizer (in place unless
    `inplace=False`, IPEX's copying default, which the tests use to show the wrong order); `options` are
    `ipex.optimize`'s other keyword arguments (`level`, `weights_prepack`, ...; None: IPEX's default)."""
    tracked = hasattr(optimizer.step, "_wrapped_by_lr_sched")
    model_out, optimizer_out = ipex.optimize(model, optimizer=optimizer, dtype=dtype, inplace=inplace, **options)
    _load_prepacked_weights_in_place(model_out)
    if tracked:
        _track_steps_for_schedulers(optimizer_out)
    return model_out, optimizer_out


def _track_steps_for_schedulers(optimizer: torch.optim.Optimizer) -> None:
    # A scheduler built before `prepare` wrapped `optimizer.step` to note that the optimizer
    # stepped; IPEX's fused step replaces that wrapper, and every scheduler step would then warn
    # that `optimizer.step()` "has been overridden" (wrongly: the order is right). Wrap the fused
    # step the same way (the two attributes torch's scheduler reads).
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        return
    fused = optimizer.step

    @functools.wraps(fused)
    def step(*args: Any, **kwargs: Any) -> Any:
        optimizer._opt_called = True  # type: ignore[attr-defined]
        return fused(*args, **kwargs)

    step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    optimizer.step = step  # type: ignore[method-assign]


def optimize_for_inference(model: torch.nn.Module, *, dtype: torch.dtype | None, **options: Any) -> torch.nn.Module:
    """`ipex.optimize` of a model in evaluation mode (folds, drops dropout, casts weights to `dtype`); `options`
    as for `optimize_for_training`."""
    out: torch.nn.Module = ipex.optimize(model.eval(), dtype=dtype, inplace=_INPLACE, **options)
    return out


def _load_prepacked_weights_in_place(model: torch.nn.Module) -> None:
    """Make `load_state_dict` into prepacked training layers keep their packed layout.

    IPEX 2.8 loads a state dict into a prepacked layer by giving its bias new storage
    (`param.data = loaded`) and re-prepacking its weight into a new packing context, while the
    layer keeps computing with the bias storage it was packed with. Measured here: a training-
    mode `_IPEXConv2d` that loads the very weights it had computes outputs off by 0.1 (and
    garbage after a step), so `load_state` could never resume. Copying the loaded values in
    place, packed into the layer's existing layout (`op_ctx.pack`, as IPEX's own optimizer
    state loading does), gives the original outputs bit for bit.
    """
    for module in model.modules():
        wrapper = getattr(module, "weight_wrapper", None)
        if wrapper is not None and getattr(wrapper, "op_ctx", None) is not None:
            module._load_from_state_dict = types.MethodType(_load_into_packed_layout, module)  # type: ignore[method-assign]


def _load_into_packed_layout(
    self: torch.nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    local_metadata: Any,
    strict: bool,
    missing_keys: list[str],
    unexpected_keys: list[str],
    error_msgs: list[str],
) -> None:
    with torch.no_grad():
        for name in ("bias", "weight"):  # IPEX's order: a conv's packing may read its bias
            wrapper = getattr(self, f"{name}_wrapper", None)
            if wrapper is None:
                continue
            if prefix + name in state_dict:
                _copy_into(wrapper, state_dict[prefix + name])
            else:
                missing_keys.append(prefix + name)


def _copy_into(wrapper: Any, fp32: torch.Tensor) -> None:
    # Always in place: the packing context computes with the storage it was built on.
    pack = wrapper.op_ctx.pack if wrapper.op_ctx is not None else (lambda t: t)
    if wrapper.split:  # bf16 parameter plus the fp32 master's low half, kept apart
        top, trail = torch.ops.torch_ipex.split_float_bfloat16(fp32)
        wrapper.parameter.data.copy_(pack(top))
        wrapper.parameter_trail.copy_(pack(trail))
    elif wrapper.split is not None:  # bf16 parameter plus a whole fp32 master
        wrapper.parameter.data.copy_(pack(fp32.to(torch.bfloat16)))
        wrapper.master_parameter.data.copy_(pack(fp32))
    elif wrapper.casted_dtype is not None:
        wrapper.parameter.data.copy_(pack(fp32.to(wrapper.casted_dtype)))
    else:
        wrapper.parameter.data.copy_(pack(fp32))


def bf16_prepack_supported() -> bool:
    """IPEX's own answer (oneDNN's ISA detection) to whether bf16 weights can be prepacked here."""
    return bool(ipex_core.onednn_has_bf16_support())


@functools.cache
def ccl_available() -> bool:
    """Whether oneCCL's bindings import; importing them registers the `ccl` backend with torch.distributed."""
    try:
        importlib.import_module("oneccl_bindings_for_pytorch")
    except ImportError:
        return False
    return True


def is_mpi_available() -> bool:
    """`torch.distributed.is_mpi_available()`: whether this torch was built with the `mpi` backend."""
    return bool(torch.distributed.is_available() and torch.distributed.is_mpi_available())


def is_xccl_available() -> bool:
    """torch's own XPU collective backend, `xccl` (torch >= 2.7 built with it; Accelerate's `is_xccl_available`)."""
    return torch_has_xccl()


# ---- XPU (Intel Data Center / Arc GPUs): torch.xpu's names, which `ipex_emulated` mirrors ----------------------
def is_available() -> bool:
    """`torch.xpu.is_available()` (False on a torch without XPU support)."""
    return hasattr(torch, "xpu") and bool(torch.xpu.is_available())


def device_count() -> int:
    return int(torch.xpu.device_count()) if is_available() else 0


def set_device(device: torch.device) -> None:
    torch.xpu.set_device(device)


def empty_cache() -> None:
    """`torch.xpu.empty_cache()` where there is an XPU; nothing to release on a CPU."""
    if is_available():
        torch.xpu.empty_cache()


def memory_stats(device: torch.device | None = None) -> dict[str, Any]:
    """`torch.xpu.memory_stats(device)`; empty on a CPU."""
    return dict(torch.xpu.memory_stats(device)) if is_available() else {}


def get_rng_state_all() -> list[torch.Tensor]:
    return list(torch.xpu.get_rng_state_all())


def set_rng_state_all(states: list[torch.Tensor]) -> None:
    torch.xpu.set_rng_state_all(states)


def manual_seed_all(seed: int) -> None:
    torch.xpu.manual_seed_all(seed)
