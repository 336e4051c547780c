"""Accelerate's fp8 recipe handlers and the launcher's fp8 settings, folded into the run's `FP8Request`.

Precedence as in Accelerate: the handler given in code chooses the backend (`TERecipeKwargs` -> "te",
`AORecipeKwargs` -> "ao", `FP8RecipeKwargs(backend=...)`), then `ACCEL_FP8_BACKEND` (which
`ACCELERATE_FP8_BACKEND`, `--fp8_backend` and a config file's `fp8_config.backend` become), else the
adapter picks. A field the handler leaves None takes the launcher's `ACCEL_FP8_<FIELD>` value, as
Accelerate's handlers read `ACCELERATE_FP8_<FIELD>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from ..errors import SettingError
from ..precision.fp8_request import AO_FIELDS, FP8_BACKENDS, MSAMP_FIELDS, TE_FIELDS, FP8Request
from .handlers import AMAX_COMPUTE_ALGOS, FP8_FORMATS, AORecipeKwargs, FP8RecipeKwargs, TERecipeKwargs

_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f")


def _flag(key: str, text: str) -> bool:
    value = text.strip().lower()
    if value not in _TRUE + _FALSE:
        raise SettingError(f"ACCEL_FP8_{key.upper()}", f"expected true or false, got {text!r}.")
    return value in _TRUE


def _whole(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise SettingError(f"ACCEL_FP8_{key.upper()}", f"expected a whole number, got {text!r}.") from None


def _choice(choices: tuple[str, ...], upper: bool) -> Callable[[str, str], str]:
    def parse(key: str, text: str) -> str:
        value = text.strip().upper() if upper else text.strip().lower()
        if value not in choices:
            raise SettingError(f"ACCEL_FP8_{key.upper()}", f"expected one of {', '.join(choices)}, got {text!r}.")
        return value

    return parse


# ACCEL_FP8_<KEY> -> (recipe field, parser). The three override flags make one field, below.
_ENV_FIELDS: dict[str, tuple[str, Callable[[str, str], Any]]] = {
    "format": ("fp8_format", _choice(FP8_FORMATS, upper=True)),
    "margin": ("margin", _whole),
    "interval": ("interval", _whole),
    "amax_history_len": ("amax_history_len", _whole),
    "amax_compute_algo": ("amax_compute_algo", _choice(AMAX_COMPUTE_ALGOS, upper=False)),
    "use_mxfp8_block_scaling": ("use_mxfp8_block_scaling", _flag),
    "use_autocast_during_eval": ("use_autocast_during_eval", _flag),
    "pad_inner_dim": ("pad_inner_dim", _flag),
    "enable_fsdp_float8_all_gather": ("enable_fsdp_float8_all_gather", _flag),
    "opt_level": ("opt_level", _choice(("O1", "O2"), upper=True)),
}
_OVERRIDES = ("override_fprop", "override_dgrad", "override_wgrad")


def _launcher_fields(env_fp8: Mapping[str, str]) -> dict[str, tuple[Any, str]]:
    """The recipe fields the launcher set: field -> (value, the variable's name)."""
    fields: dict[str, tuple[Any, str]] = {}
    for key, (name, parse) in _ENV_FIELDS.items():
        if key in env_fp8:
            fields[name] = (parse(key, env_fp8[key]), f"ACCEL_FP8_{key.upper()}")
    if any(k in env_fp8 for k in _OVERRIDES):
        value = tuple(_flag(k, env_fp8[k]) if k in env_fp8 else False for k in _OVERRIDES)
        fields["override_linear_precision"] = (value, "ACCEL_FP8_OVERRIDE_{FPROP,DGRAD,WGRAD}")
    return fields


def fp8_request(handlers: Mapping[type, Any], env_fp8: Mapping[str, str]) -> FP8Request:
    """The run's `FP8Request` from the kwargs handlers (by class) and the launcher's `ACCEL_FP8_*` values.

    Raises:
        ValueError: two fp8 recipe handlers (each chooses a backend), or `FP8RecipeKwargs(backend='AO')` with
            fields of the "te" family.
        SettingError: an `ACCEL_FP8_*` value that does not parse (only when no handler field replaces it).
    """
    given = [h for kind, h in handlers.items() if issubclass(kind, (TERecipeKwargs, AORecipeKwargs))]
    if len(given) > 1:
        names = " and ".join(type(h).__name__ for h in given)
        raise ValueError(f"Pass one fp8 recipe handler, got {names}: each chooses the fp8 backend. Keep one.")
    handler = given[0] if given else None
    backend, backend_source = None, ""
    if isinstance(handler, FP8RecipeKwargs):
        if handler.backend is not None:
            backend, backend_source = handler.backend.lower(), "FP8RecipeKwargs(backend=)"
    elif isinstance(handler, TERecipeKwargs):
        backend, backend_source = "te", "TERecipeKwargs"
    elif isinstance(handler, AORecipeKwargs):
        backend, backend_source = "ao", "AORecipeKwargs"
    if backend is None and "backend" in env_fp8:
        backend = _choice(FP8_BACKENDS, upper=False)("backend", env_fp8["backend"])
        backend_source = "ACCEL_FP8_BACKEND"
    if backend is None and isinstance(handler, FP8RecipeKwargs):
        backend, backend_source = "te", "FP8RecipeKwargs (backend defaults to 'TE')"

    launcher = {name: pair for name, pair in _launcher_fields(env_fp8).items() if name not in _code_fields(handler)}
    settings: dict[str, Any] = {name: value for name, (value, _) in launcher.items()}
    sources = {name: source for name, (_, source) in launcher.items()}
    code = _code_fields(handler)
    settings.update(code)
    sources.update({name: f"{type(handler).__name__}({name}=)" for name in code})
    if backend is not None:
        family = {"te": TE_FIELDS, "ao": AO_FIELDS, "msamp": MSAMP_FIELDS}[backend]
        stray = [name for name in code if name not in family]
        if stray:
            raise ValueError(
                f"{type(handler).__name__}(backend={backend.upper()!r}) with {', '.join(stray)}: these fields "
                f"configure the 'te' backend. Drop them, or use TERecipeKwargs."
            )
        # Launcher defaults of another family configure a backend this run does not use (Accelerate reads them
        # only in that family's handler).
        settings = {k: v for k, v in settings.items() if k in family}
        sources = {k: v for k, v in sources.items() if k in family}
    return FP8Request(
        backend=backend,
        backend_source=backend_source,
        settings=MappingProxyType(settings),
        sources=MappingProxyType(sources),
    )


def _code_fields(handler: Any) -> dict[str, Any]:
    """The recipe fields a handler sets (None: left to the launcher or the backend)."""
    if handler is None:
        return {}
    names = AO_FIELDS if isinstance(handler, AORecipeKwargs) else TE_FIELDS
    return {name: value for name in names if (value := getattr(handler, name, None)) is not None}
