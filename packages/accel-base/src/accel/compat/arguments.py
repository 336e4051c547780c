"""The `Accelerator`'s arguments, translated once into `AcceleratorSettings`.

Accelerate's spellings become accel's here and nowhere else: objects built with the real Accelerate are
converted (`compat.objects`), `deepspeed_plugins=` / `torch_tp_plugin=` become the DeepSpeed strategy's
plugins and a `ParallelismConfig`, and what a launcher decided (`accel launch` flags, config files,
`accelerate launch`'s variables) fills what the script left unset. Every check on the arguments runs here,
before anything is built.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import UnsupportedHandlerError
from ..settings.accelerator import DEFAULT_GRADIENT_ACCUMULATION_STEPS, AcceleratorSettings
from ..settings.env import EnvSettings, read_env
from ..settings.kwargs import (
    DataLoaderConfiguration,
    GradientAccumulationPlugin,
    KwargsHandler,
    ProjectConfiguration,
    TorchDynamoPlugin,
    check_positive_int,
)
from ..strategies.deepspeed.config import DeepSpeedPlugin
from ..strategies.deepspeed.plugins import NO_PLUGINS
from ..strategies.parallelism_config import (
    ParallelismConfig,
    as_parallelism_config,
    from_environment,
    with_parallelism,
)
from .env import _warn, apply_accelerate_env, launch_defaults
from .handlers import fp8_request
from .objects import convert, convert_accelerator_arguments, user_stacklevel
from .table import AccelerateFeatureError

# Configuration objects that have their own `Accelerator` argument (a common slip is to pass them as handlers).
_HANDLER_HINTS = {
    "ProjectConfiguration": " (pass it as `project_config=`)",
    "DataLoaderConfiguration": " (pass it as `dataloader_config=`)",
}


def accelerator_settings(
    *,
    device_placement: bool,
    split_batches: bool | None,
    mixed_precision: str | None,
    gradient_accumulation_steps: int,
    cpu: bool,
    dataloader_config: DataLoaderConfiguration | None,
    deepspeed_plugin: Any,
    fsdp_plugin: Any,
    torch_tp_plugin: Any,
    megatron_lm_plugin: Any,
    rng_types: list[str] | None,
    log_with: Any,
    project_dir: str | os.PathLike[str] | None,
    project_config: ProjectConfiguration | None,
    gradient_accumulation_plugin: GradientAccumulationPlugin | None,
    step_scheduler_with_optimizer: bool,
    kwargs_handlers: list[KwargsHandler] | None,
    dynamo_backend: str | None,
    dynamo_plugin: TorchDynamoPlugin | None,
    deepspeed_plugins: Any,
    parallelism_config: Any,
    adapter: str | None,
    adapter_options: Mapping[str, Any] | None,
    emulate: bool | None,
    strategy: str | None,
    strategy_config: Any,
    even_batches: bool | None,
) -> AcceleratorSettings:
    """`AcceleratorSettings` from the `Accelerator`'s arguments (see its docstring), the environment and the
    launcher's defaults.

    Raises:
        ValueError: conflicting arguments (two DeepSpeed spellings, two plugins, a plugin and another
            `strategy=`, a handler given twice, `gradient_accumulation_steps` with a plugin), or a bad
            `gradient_accumulation_steps` / `ACCEL_GRADIENT_ACCUMULATION_STEPS`.
        TypeError: a `deepspeed_plugins` value that is not a DeepSpeedPlugin; `UnsupportedHandlerError` for
            something in `kwargs_handlers` that is not a handler.
        AccelerateFeatureError: a `torch_tp_plugin` without an integer `tp_size`.
        AccelerateObjectError: an object of the real Accelerate accel cannot take over.
        SettingError: a launcher setting accel cannot honour.
    """
    deepspeed_plugin = _deepspeed_plugins(deepspeed_plugin, deepspeed_plugins)
    parallelism_config = _tp_plugin_as_parallelism(torch_tp_plugin, parallelism_config)
    # What a launcher decided (accel launch flags, config files, `accelerate launch`'s variables).
    apply_accelerate_env()
    env = read_env()
    _warn_code_over_launcher(
        env,
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=gradient_accumulation_steps,
        gradient_accumulation_plugin=gradient_accumulation_plugin,
        cpu=cpu,
        adapter=adapter,
        emulate=emulate,
        strategy=strategy,
        plugins={"fsdp2": fsdp_plugin, "deepspeed": deepspeed_plugin, "megatron": megatron_lm_plugin},
        dynamo_backend=dynamo_backend,
        dynamo_plugin=dynamo_plugin,
        kwargs_handlers=kwargs_handlers,
    )
    plugins = (fsdp_plugin, deepspeed_plugin, megatron_lm_plugin)
    asked = strategy is not None or any(p is not None for p in plugins)
    strategy, strategy_config, dynamo_plugin = launch_defaults(
        strategy, strategy_config, any(p is not None for p in plugins), dynamo_backend, dynamo_plugin, env=env
    )
    if not asked and (launcher_pc := from_environment()) is not None:
        # `--use_parallelism_config`: the sizes (the script's config, else the launcher's) pick the strategy.
        strategy, parallelism_config = None, launcher_pc if parallelism_config is None else parallelism_config
    # Objects built with the real Accelerate: converted to accel's with a warning, or refused.
    (kwargs_handlers, dataloader_config, project_config, gradient_accumulation_plugin, dynamo_plugin) = (
        convert_accelerator_arguments(
            {
                "kwargs_handlers": kwargs_handlers,
                "dataloader_config": dataloader_config,
                "project_config": project_config,
                "gradient_accumulation_plugin": gradient_accumulation_plugin,
                "dynamo_plugin": dynamo_plugin,
            }
        ).values()
    )
    fsdp_plugin, megatron_lm_plugin = (
        convert(fsdp_plugin, "fsdp_plugin"),
        convert(megatron_lm_plugin, "megatron_lm_plugin"),
    )
    handlers = _sort_handlers(kwargs_handlers or [])

    if project_config is None:
        project_config = ProjectConfiguration(project_dir=str(project_dir) if project_dir else None)
    elif project_dir is not None:
        project_config.set_directories(str(project_dir))

    loader_config = dataloader_config or DataLoaderConfiguration()
    if split_batches is not None:
        loader_config.split_batches = split_batches
    if even_batches is not None:
        loader_config.even_batches = even_batches

    if dynamo_plugin is None and dynamo_backend is not None:
        dynamo_plugin = TorchDynamoPlugin(backend=str(dynamo_backend).lower())
    elif dynamo_plugin is None:
        dynamo_plugin = TorchDynamoPlugin()

    strategy, strategy_config = _pick_strategy(
        strategy, strategy_config, fsdp_plugin, deepspeed_plugin, megatron_lm_plugin
    )
    if parallelism_config is not None:
        parallelism_config = as_parallelism_config(parallelism_config)
        strategy, strategy_config = with_parallelism(parallelism_config, strategy, strategy_config)

    if gradient_accumulation_plugin is not None and gradient_accumulation_steps != 1:
        raise ValueError(
            "You can only pass one of `gradient_accumulation_steps` and `gradient_accumulation_plugin`. "
            "Set `num_steps` in the plugin instead."
        )
    if gradient_accumulation_plugin is None:
        gradient_accumulation_plugin = GradientAccumulationPlugin(
            num_steps=_accumulation_steps(gradient_accumulation_steps, env)
        )
    return AcceleratorSettings(
        env=env,
        mixed_precision=mixed_precision,
        cpu=cpu,
        adapter=adapter,
        adapter_options=adapter_options,
        emulate=emulate,
        strategy=strategy,
        strategy_config=strategy_config,
        parallelism_config=parallelism_config,
        torch_tp_plugin=torch_tp_plugin,
        handlers=handlers,
        fp8=fp8_request(handlers, env.fp8),
        project_config=project_config,
        dataloader_config=loader_config,
        dynamo_plugin=dynamo_plugin,
        gradient_accumulation_plugin=gradient_accumulation_plugin,
        device_placement=device_placement,
        step_scheduler_with_optimizer=step_scheduler_with_optimizer,
        rng_types=list(rng_types) if rng_types is not None else ["generator"],
        log_with=log_with,
    )


def _accumulation_steps(steps: Any, env: EnvSettings) -> int:
    """`gradient_accumulation_steps` when passed in code, else `ACCEL_GRADIENT_ACCUMULATION_STEPS` when set, else 1."""
    if isinstance(steps, float) and steps.is_integer():
        steps = int(steps)  # 2.0 means 2 (Accelerate takes it); 2.5 is refused below
    check_positive_int(steps, "gradient_accumulation_steps", hint="Pass a whole number of micro-batches, e.g. 2.")
    from_env = env.gradient_accumulation_steps  # checked even when the code's value wins
    return from_env if from_env is not None and steps is DEFAULT_GRADIENT_ACCUMULATION_STEPS else int(steps)


def _warn_code_over_launcher(
    env: EnvSettings,
    *,
    mixed_precision: Any,
    gradient_accumulation_steps: Any,
    gradient_accumulation_plugin: Any,
    cpu: bool,
    adapter: Any,
    emulate: Any,
    strategy: Any,
    plugins: Mapping[str, Any],
    dynamo_backend: Any,
    dynamo_plugin: Any,
    kwargs_handlers: Any,
) -> None:
    """One warning naming each setting the script passes with a value other than the launcher's variable.

    The script's value wins (as `Accelerator(mixed_precision=)` does in Accelerate); the launcher's applies only
    where the script passes nothing.
    """
    # (argument as written in code, the code's value, the variable, the launcher's value); None: not given.
    accumulation = None
    if gradient_accumulation_plugin is not None:
        accumulation = getattr(gradient_accumulation_plugin, "num_steps", None)
    elif gradient_accumulation_steps is not DEFAULT_GRADIENT_ACCUMULATION_STEPS:
        accumulation = gradient_accumulation_steps
    plugin = next((name for name, p in plugins.items() if p is not None), None)
    code_strategy = strategy if strategy is not None else plugin
    code_dynamo = dynamo_backend if dynamo_backend is not None else getattr(dynamo_plugin, "backend", None)
    timeout = next((getattr(h, "timeout", None) for h in kwargs_handlers or () if hasattr(h, "timeout")), None)
    launcher_timeout = env.timeout_text
    pairs = [
        ("mixed_precision", mixed_precision, "ACCEL_MIXED_PRECISION", env.mixed_precision),
        (
            "gradient_accumulation_steps",
            accumulation,
            env.gradient_accumulation_variable,
            env.gradient_accumulation_text.strip() or None,
        ),
        ("cpu", True if cpu else None, "ACCEL_ADAPTER", env.adapter if env.adapter not in (None, "cpu") else None),
        ("adapter", adapter, "ACCEL_ADAPTER", env.adapter),
        ("adapter", adapter, "ACCEL_USE_CPU", "1" if env.use_cpu and adapter not in (None, "cpu") else None),
        ("emulate", emulate, "ACCEL_EMULATE", "1" if env.emulate else None),
        ("strategy", code_strategy, "ACCEL_STRATEGY", env.strategy),
        ("dynamo_backend", code_dynamo, "ACCEL_DYNAMO_BACKEND", env.dynamo_backend),
        (
            "InitProcessGroupKwargs(timeout=)",
            timeout.total_seconds() if timeout is not None else None,
            "ACCEL_TIMEOUT",
            launcher_timeout,
        ),
    ]
    differ = []
    for name, code, variable, launched in pairs:
        if code is None or launched is None or _same(code, launched):
            continue
        shown = name if "(" in name else f"{name}={code!r}"
        if name == "InitProcessGroupKwargs(timeout=)":
            shown = f"InitProcessGroupKwargs(timeout={code:g}s)"
        if name == "strategy" and strategy is None:
            shown = f"{plugin} plugin"
        differ.append(f"{shown} in the code wins over {variable}={launched} from the launcher")
    if differ:
        _warn(
            "Accelerator(): "
            + "; ".join(differ)
            + ". Drop the argument to use the launcher's value, or change the flag or config file "
            "(docs/launching.md, 'Which value wins')."
        )


def _same(code: Any, launched: str) -> bool:
    """Whether the code's value and a variable's text say the same thing ("bf16" and "BF16", 2 and "2", ...)."""
    text = str(launched).strip().lower()
    code = getattr(code, "value", code)  # an enum (Accelerate's `DynamoBackend.INDUCTOR`, `PrecisionType.BF16`)
    if isinstance(code, bool):
        return code == (text in ("1", "true", "yes", "on"))
    if isinstance(code, (int, float)):
        try:
            return float(code) == float(text)
        except ValueError:
            return False
    return str(code).strip().lower() == text


def _deepspeed_plugins(plugin: Any, plugins: Any) -> Any:
    """The DeepSpeed strategy's config from `deepspeed_plugin=` / `deepspeed_plugins=`: one plugin, or a
    `{name: plugin}` dict (Accelerate's plugins converted to accel's).

    Raises:
        ValueError: both arguments given, or an empty dict (Accelerate's first message).
        TypeError: a dict value that is not a DeepSpeedPlugin (Accelerate's message).
    """
    if plugins is not None and plugin is not None:
        raise ValueError("You cannot pass in both `deepspeed_plugins` and `deepspeed_plugin`.")
    given = plugins if plugins is not None else plugin
    if not isinstance(given, Mapping):
        return convert(given, "deepspeed_plugin")
    if not given:
        raise ValueError(NO_PLUGINS)
    converted = {str(name): convert(p, f"deepspeed_plugins[{name!r}]") for name, p in given.items()}
    if not all(isinstance(p, DeepSpeedPlugin) for p in converted.values()):
        raise TypeError("`deepspeed_plugin` must be a DeepSpeedPlugin object.")
    return converted


def _tp_plugin_as_parallelism(plugin: Any, parallelism_config: Any) -> Any:
    """Accelerate's deprecated `torch_tp_plugin`: a FutureWarning, then `ParallelismConfig(tp_size=plugin.tp_size)`
    unless a `parallelism_config` is given (which wins, as in Accelerate)."""
    if plugin is None:
        return parallelism_config
    tp_size = getattr(plugin, "tp_size", None)
    if not isinstance(tp_size, int) or isinstance(tp_size, bool):
        raise AccelerateFeatureError(
            f"Accelerator(torch_tp_plugin={plugin!r}): expected Accelerate's `TorchTensorParallelPlugin` (an object "
            "with an integer `tp_size`). Tensor parallelism is configured with "
            "`Accelerator(parallelism_config=ParallelismConfig(tp_size=...))` (accel.utils; docs/parallelism.md)."
        )
    warnings.warn(
        "`TorchTensorParallelPlugin` is deprecated and will be removed in a future version of Accelerate. "
        "Please use the `ParallelismConfig` with `tp_size` instead.",
        FutureWarning,
        stacklevel=user_stacklevel(),
    )
    return parallelism_config if parallelism_config is not None else ParallelismConfig(tp_size=tp_size)


def _sort_handlers(handlers: list[KwargsHandler]) -> dict[type, Any]:
    found: dict[type, Any] = {}
    for handler in handlers:
        if not isinstance(handler, KwargsHandler):
            raise UnsupportedHandlerError(
                f"Unsupported kwargs handler passed: {handler!r}, must be one that inherits `accel.settings.kwargs.KwargsHandler`"
                f"{_HANDLER_HINTS.get(type(handler).__name__, '')}."
            )
        kind = type(handler)
        if kind in found:
            raise ValueError(f"You can only pass one {kind.__name__} in `kwargs_handlers`.")
        found[kind] = handler
    return found


def _pick_strategy(
    strategy: str | None, config: Any, fsdp: Any, deepspeed: Any, megatron: Any
) -> tuple[str | None, Any]:
    chosen = [
        (name, plugin)
        for name, plugin in (("fsdp2", fsdp), ("deepspeed", deepspeed), ("megatron", megatron))
        if plugin is not None
    ]
    if len(chosen) > 1:
        raise ValueError(
            f"Pass at most one of fsdp_plugin, deepspeed_plugin, megatron_lm_plugin; got {[c[0] for c in chosen]}."
        )
    if chosen:
        name, plugin = chosen[0]
        if strategy is not None and strategy != name:
            raise ValueError(f"strategy={strategy!r} conflicts with the {name} plugin you passed.")
        return name, plugin
    return strategy, config
