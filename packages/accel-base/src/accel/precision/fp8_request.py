"""The fp8 recipe a run asks for, in backend-neutral terms: what the core hands the adapter's precision.

Users name an fp8 recipe with Accelerate's handlers (`TERecipeKwargs`, `AORecipeKwargs`,
`FP8RecipeKwargs(backend=...)`) or with the launcher (`ACCEL_FP8_*`, which `accelerate launch`'s
`ACCELERATE_FP8_*` and `--fp8_*` flags become). The edge (`accel.compat.handlers`) folds them into one
`FP8Request`; the adapter's precision reads it from `RunContext.fp8` and builds its own recipe objects.
Every setting in the request is either applied or refused by the adapter (`FP8Request.refuse`), so
nothing a user configured is dropped in silence.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import FP8RecipeError

FP8_BACKENDS = ("te", "ao", "msamp")
"""The recipe families a request can name: "te" (delayed scaling, Transformer-Engine style layers),
"ao" (torchao's float8 training), "msamp" (MS-AMP's optimisation levels)."""

TE_FIELDS = (
    "fp8_format",
    "margin",
    "interval",
    "amax_history_len",
    "amax_compute_algo",
    "override_linear_precision",
    "use_mxfp8_block_scaling",
    "use_autocast_during_eval",
)
"""The "te" family's settings (Accelerate's `TERecipeKwargs` fields)."""
AO_FIELDS = ("config", "module_filter_func", "pad_inner_dim", "enable_fsdp_float8_all_gather")
"""The "ao" family's settings (Accelerate's `AORecipeKwargs` fields)."""
MSAMP_FIELDS = ("opt_level",)
"""The "msamp" family's settings (Accelerate's `MSAMPRecipeKwargs` fields)."""
FAMILY_FIELDS = {"te": TE_FIELDS, "ao": AO_FIELDS, "msamp": MSAMP_FIELDS}


@dataclass(kw_only=True, frozen=True)
class FP8Request:
    """What the user asked of fp8 (`RunContext.fp8`). Built by the core; read, never changed, by adapters."""

    backend: str | None = None
    """"te", "ao" or "msamp" when the user chose one (handler in code, else the launcher); None: the
    adapter picks."""
    backend_source: str = ""
    """Who chose `backend`, for messages ("TERecipeKwargs", "FP8RecipeKwargs(backend=)", "ACCEL_FP8_BACKEND")."""
    settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The recipe settings that were given, by field name (`TE_FIELDS`, `AO_FIELDS`, `MSAMP_FIELDS`). Absent:
    the backend's default. With `backend` None they may hold launcher defaults of several families: the
    adapter applies those of the family it runs."""
    sources: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Where each setting came from ("TERecipeKwargs(margin=)", "ACCEL_FP8_MARGIN")."""

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles with its read-only views as plain dicts (an `Accelerator`, which holds this request, pickles)."""
        return (_rebuild, (self.backend, self.backend_source, dict(self.settings), dict(self.sources)))

    def get(self, name: str, default: Any = None) -> Any:
        """The setting `name` when it was given, else `default` (the backend's own)."""
        value = self.settings.get(name)
        return default if value is None else value

    def given(self, family: str) -> dict[str, Any]:
        """The settings of `family` ("te", "ao", "msamp") that were given."""
        return {k: v for k, v in self.settings.items() if k in FAMILY_FIELDS[family] and v is not None}

    def refuse(self, name: str, why: str) -> FP8RecipeError:
        """The error for setting `name`, which the backend cannot honour: "<source> = <value>: <why>"."""
        source = self.sources.get(name, name)
        return FP8RecipeError(f"{source} = {self.settings.get(name)!r}: {why}")

    def refuse_unless(self, name: str, allowed: Iterable[Any], why: str) -> None:
        """Raise `refuse(name, why)` when `name` was given with a value outside `allowed`.

        Raises:
            FP8RecipeError: as described.
        """
        value = self.settings.get(name)
        if value is not None and value not in tuple(allowed):
            raise self.refuse(name, why)


NO_FP8_REQUEST = FP8Request()
"""Nothing asked: the adapter's defaults throughout."""


def _rebuild(backend: str | None, backend_source: str, settings: dict[str, Any], sources: dict[str, str]) -> FP8Request:
    return FP8Request(
        backend=backend,
        backend_source=backend_source,
        settings=MappingProxyType(settings),
        sources=MappingProxyType(sources),
    )
