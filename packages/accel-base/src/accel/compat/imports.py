"""`is_<library>_available()` probes for optional libraries, as Accelerate's `utils` has them.

Each probe answers whether the library can be imported here (without importing it). The
probes that name hardware (`is_<vendor>_available`) come from the adapter packages; precision
probes (`is_bf16_available`, ...) ask the adapter in use.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from collections.abc import Callable
from typing import Any

from packaging import version as _version


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def _probe(module: str, doc_name: str | None = None) -> Callable[[], bool]:
    @functools.cache
    def probe() -> bool:
        return _installed(module)

    probe.__name__ = f"is_{doc_name or module}_available"
    probe.__doc__ = f"Whether `{module}` can be imported."
    return probe


is_aim_available = _probe("aim")
is_boto3_available = _probe("boto3")
is_clearml_available = _probe("clearml")
is_comet_ml_available = _probe("comet_ml")
is_datasets_available = _probe("datasets")
is_deepspeed_available = _probe("deepspeed")
is_dvclive_available = _probe("dvclive")
is_matplotlib_available = _probe("matplotlib")
is_mlflow_available = _probe("mlflow")
is_pandas_available = _probe("pandas")
is_peft_available = _probe("peft")
is_pytest_available = _probe("pytest")
is_rich_available = _probe("rich")
is_schedulefree_available = _probe("schedulefree")
is_swanlab_available = _probe("swanlab")
is_timm_available = _probe("timm")
is_torchao_available = _probe("torchao")
is_torchdata_available = _probe("torchdata")
is_torchvision_available = _probe("torchvision")
is_trackio_available = _probe("trackio")
is_transformers_available = _probe("transformers")
is_triton_available = _probe("triton")
is_wandb_available = _probe("wandb")
is_lomo_available = _probe("lomo_optim", "lomo")
is_msamp_available = _probe("msamp")
is_megatron_lm_available = _probe("megatron", "megatron_lm")
is_import_timer_available = _probe("import_timer")
is_tqdm_available = _probe("tqdm")
_bnb_installed = _probe("bitsandbytes", "bnb")


def is_bnb_available(min_version: str | None = None) -> bool:
    """Whether bitsandbytes is installed (at `min_version` or newer when given, as in Accelerate)."""
    if not _bnb_installed():
        return False
    return min_version is None or compare_versions("bitsandbytes", ">=", min_version)


def is_4bit_bnb_available() -> bool:
    """Whether bitsandbytes with 4-bit support (>= 0.39) is installed."""
    return is_bnb_available() and compare_versions("bitsandbytes", ">=", "0.39.0")


def is_8bit_bnb_available() -> bool:
    """Whether bitsandbytes with 8-bit support (>= 0.37.2) is installed."""
    return is_bnb_available() and compare_versions("bitsandbytes", ">=", "0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether bitsandbytes is installed with its multi-backend support."""
    if not is_bnb_available():
        return False
    import bitsandbytes

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_pippy_available() -> bool:
    """Whether torch's pipelining package exists (accel itself does not prepare pipelines)."""
    return _installed("torch.distributed.pipelining")


def is_sagemaker_available() -> bool:
    """Whether the SageMaker SDK and boto3 are installed (accel has no SageMaker launcher)."""
    return _installed("sagemaker") and _installed("boto3")


def is_tensorboard_available() -> bool:
    """Whether a TensorBoard writer can be imported (`tensorboard` or `tensorboardX`)."""
    return _installed("tensorboard") or _installed("tensorboardX")


def is_torchdata_stateful_dataloader_available() -> bool:
    """Whether torchdata's `StatefulDataLoader` (torchdata >= 0.8) is installed."""
    if not _installed("torchdata"):
        return False
    return _version.parse(importlib.metadata.version("torchdata")) >= _version.parse("0.8.0")


def is_transformer_engine_available() -> bool:
    return _installed("transformer_engine")


def is_weights_only_available() -> bool:
    """Whether `torch.load(weights_only=True)` exists (torch >= 2.4)."""
    return is_torch_version(">=", "2.4.0")


def _precision_supported(precision: str) -> bool:
    from ..distributed.state import PartialState

    return bool(PartialState().adapter.supports_precision(precision))


def is_bf16_available(*args: Any, **kwargs: Any) -> bool:
    """Whether the adapter in use supports bf16 mixed precision (Accelerate's hardware flag is ignored)."""
    return _precision_supported("bf16")


def is_fp16_available() -> bool:
    """Whether the adapter in use supports fp16 mixed precision."""
    return _precision_supported("fp16")


def is_fp8_available() -> bool:
    """Whether the adapter in use supports fp8 mixed precision."""
    return _precision_supported("fp8")


def _requires(probe: Callable[[], bool], library: str, extra: str) -> Callable[[Any], Any]:
    def decorator(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not probe():
                raise ImportError(f"{func.__name__} needs {library}: `pip install {extra}`.")
            return func(*args, **kwargs)

        return wrapper

    return decorator


deepspeed_required = _requires(is_deepspeed_available, "DeepSpeed", "accel-base[deepspeed]")
"""Decorator: the function raises ImportError naming the extra when DeepSpeed is not installed."""
torchao_required = _requires(is_torchao_available, "torchao", "torchao")
"""Decorator: the function raises ImportError when torchao is not installed."""

_OPS = {"<": "__lt__", "<=": "__le__", "==": "__eq__", "!=": "__ne__", ">=": "__ge__", ">": "__gt__"}


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """`library_or_version` (an installed distribution's name or a version) `operation` `requirement_version`.

    Raises:
        ValueError: an operation other than <, <=, ==, !=, >=, >.
    """
    if operation not in _OPS:
        raise ValueError(f"`operation` must be one of {list(_OPS)}, received {operation}")
    if isinstance(library_or_version, str):
        library_or_version = _version.parse(importlib.metadata.version(library_or_version))
    return bool(getattr(library_or_version, _OPS[operation])(_version.parse(requirement_version)))


def is_torch_version(operation: str, version: str) -> bool:
    """Whether the running torch's (base) version compares to `version` as `operation` says."""
    import torch

    return compare_versions(_version.parse(_version.parse(torch.__version__).base_version), operation, version)


__all__ = [n for n in dir() if n.startswith("is_")] + ["compare_versions", "deepspeed_required", "torchao_required"]
