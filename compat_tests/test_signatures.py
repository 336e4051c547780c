"""Every name docs/accelerate_compat.md calls "supported" (or "supported differently") takes the parameters
Accelerate 1.15.0's takes, by name and in the same positional order, so an Accelerate script's call does not
end in a bare TypeError. A difference is allowed only when listed in ALLOWED, each with the reason.

Compared: the parameter names of `inspect.signature` (a class's `__init__`, a member of Accelerator or the
state classes looked up statically); `*args`/`**kwargs` themselves are not compared, and accel taking *more*
parameters is fine. A name Accelerate takes that accel lacks is a mismatch even when accel has `**kwargs`
(it would be swallowed without effect). A dataclass (kwargs handler, plugin) of accel may be keyword-only.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
from pathlib import Path
from typing import Any

import pytest
from accelerate_names import ACCELERATE_NAMES

TABLE = Path(__file__).parent.parent / "docs" / "accelerate_compat.md"
MEMBER_OWNERS = {
    "Accelerator": ("accelerate", "accel"),
    "PartialState": ("accelerate.state", "accel.state"),
    "AcceleratorState": ("accelerate.state", "accel.state"),
    "GradientState": ("accelerate.state", "accel.state"),
}

# (owner, name) -> why accel's signature is allowed to differ from Accelerate 1.15.0's.
ALLOWED: dict[tuple[str, str], str] = {
    # Same fields by keyword; the order differs because FP8RecipeKwargs extends TERecipeKwargs (opt_level, which
    # Accelerate puts first, is MS-AMP's and refused anyway).
    ("accelerate.utils", "FP8RecipeKwargs"): "keyword-identical; positional order follows TERecipeKwargs",
    # Same behaviour; the first parameter is named `model` (Accelerate: `module`) and the options are **kwargs.
    ("accelerate.utils", "compile_regions"): "first parameter named `model`, not `module`",
    # The object is the first positional parameter in both; accel calls it `obj` (it shadows no builtin).
    ("accelerate.utils", "gather_object"): "first parameter named `obj`, not `object`",
    # Takes *args/**kwargs; the flag asks about TPUs, which accel-base cannot name: the adapter in use answers.
    ("accelerate.utils", "is_bf16_available"): "ignore_tpu is absorbed: the adapter in use answers",
    # Members and constructors owned by other modules (accelerator.py, state.py, data loaders): tracked by
    # issue 16 item 1; each entry goes when its parameters are accepted or refused by name.
    ("accelerate.data_loader", "BatchSamplerShard"): "num_processes... are keyword-only (data_shard.py): issue 16",
    ("accelerate.data_loader", "IterableDatasetShard"): "batch_size... are keyword-only (data_shard.py): issue 16",
    ("accelerate.state", "AcceleratorState"): "plugins are given to the Accelerator, not the state: issue 16",
    ("accelerate.data_loader", "DataLoaderDispatcher"): "accel's loaders take a resume position, not these",
    ("accelerate.data_loader", "DataLoaderShard"): "accel's loaders take a resume position, not these",
    ("Accelerator", "deepspeed_ulysses_dl_adapter"): "raises NotImplementedError (no Ulysses sequence parallelism)",
}


def table_rows() -> dict[tuple[str, str], str]:
    rows: dict[tuple[str, str], str] = {}
    owner = None
    for line in TABLE.read_text().splitlines():
        if line.startswith("## "):
            m = re.search(r"`([^`]+)`", line)
            owner = m.group(1) if m else None
        elif line.startswith("| `") and owner:
            cells = [c.strip() for c in line.split("|")]
            rows[(owner, cells[1].strip("`"))] = cells[2]
    return rows


def parameters(obj: Any) -> list[inspect.Parameter] | None:
    try:
        sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    except (TypeError, ValueError):
        return None
    return [p for p in sig.parameters.values() if p.name != "self"]


def counterparts(owner: str, name: str) -> tuple[Any, Any] | None:
    """(Accelerate's object, accel's) for a table row, or None when either is not a callable to compare."""
    if owner in MEMBER_OWNERS:
        real_mod, accel_mod = MEMBER_OWNERS[owner]
        real_cls = getattr(importlib.import_module(real_mod), owner)
        accel_cls = getattr(importlib.import_module(accel_mod), owner)
        try:
            real, mine = inspect.getattr_static(real_cls, name), inspect.getattr_static(accel_cls, name)
        except AttributeError:
            return None
        if isinstance(real, property) or isinstance(mine, property):
            return None
        real = real.__func__ if isinstance(real, (staticmethod, classmethod)) else real
        mine = mine.__func__ if isinstance(mine, (staticmethod, classmethod)) else mine
    else:
        real = getattr(importlib.import_module(owner), name)
        mine = getattr(importlib.import_module("accel" + owner[len("accelerate") :]), name)
    if not (callable(real) and callable(mine)):
        return None
    return real, mine


def difference(real: Any, mine: Any) -> str | None:
    """What accel's signature lacks or orders differently, or None when it takes Accelerate's calls."""
    theirs, ours = parameters(real), parameters(mine)
    if theirs is None or ours is None:
        return None
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ours_names = {p.name for p in ours}
    missing = [p.name for p in theirs if p.kind not in variadic and p.name not in ours_names]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    pos_theirs = [p.name for p in theirs if p.kind in positional]
    pos_ours = [p.name for p in ours if p.kind in positional]
    n = min(len(pos_theirs), len(pos_ours))
    problems = []
    if missing:
        problems.append(f"lacks {missing}")
    # accel's config dataclasses (kwargs handlers, plugins) are keyword-only by design; a function must take
    # Accelerate's positional arguments positionally.
    fewer = len(pos_ours) < len(pos_theirs) and not dataclasses.is_dataclass(real)
    if pos_theirs[:n] != pos_ours[:n] or fewer:
        problems.append(f"positional {pos_ours} vs Accelerate's {pos_theirs}")
    return "; ".join(problems) or None


def all_differences() -> dict[tuple[str, str], str]:
    os.environ.setdefault("ACCEL_USE_CPU", "1")
    rows = table_rows()
    found = {}
    for owner, names in ACCELERATE_NAMES.items():
        for name in names:
            if rows.get((owner, name)) not in ("supported", "supported differently"):
                continue
            pair = counterparts(owner, name)
            if pair is None:
                continue
            diff = difference(*pair)
            if diff:
                found[(owner, name)] = diff
    return found


def test_supported_names_take_accelerates_parameters(real_accelerate: Path) -> None:
    unexpected = {k: v for k, v in all_differences().items() if k not in ALLOWED}
    assert not unexpected, "signatures differ from Accelerate 1.15.0's (fix, or add to ALLOWED with the reason):\n" + (
        "\n".join(f"{owner}.{name}: {diff}" for (owner, name), diff in sorted(unexpected.items()))
    )


def test_the_allow_list_has_no_stale_entries(real_accelerate: Path) -> None:
    stale = sorted(set(ALLOWED) - set(all_differences()))
    assert not stale, f"these now match Accelerate: remove them from ALLOWED: {stale}"


def test_the_comparison_sees_a_difference(real_accelerate: Path) -> None:
    def accelerates(tensor: Any, device: Any, non_blocking: bool = False, skip_keys: Any = None) -> None: ...

    def old_accel(data: Any, device: Any, *, non_blocking: bool = False) -> None: ...

    def fixed(tensor: Any, device: Any, non_blocking: bool = False, skip_keys: Any = None, extra: int = 0) -> None: ...

    diff = difference(accelerates, old_accel)
    assert diff is not None and "skip_keys" in diff and "positional" in diff
    assert difference(accelerates, fixed) is None


@pytest.mark.parametrize(
    "owner,name",
    [("accelerate.utils", "send_to_device"), ("accelerate.utils", "extract_model_from_parallel")],
)
def test_fixed_names_are_compared_and_match(real_accelerate: Path, owner: str, name: str) -> None:
    assert table_rows()[(owner, name)] in ("supported", "supported differently")
    pair = counterparts(owner, name)
    assert pair is not None
    assert difference(*pair) is None


def test_fixed_utils_answer_as_accelerates_do(real_accelerate: Path) -> None:
    """The parameters added for issue 16 give Accelerate's results, compared with the real Accelerate."""
    import accel.utils as ours
    import accelerate.utils as theirs
    import torch

    batch = {"x": torch.ones(2), "ids": torch.arange(3), "nest": [{"ids": torch.zeros(1), "y": torch.ones(1)}]}

    def devices(nest: Any) -> Any:
        return theirs.recursively_apply(lambda t: t.device.type, nest)

    for args in [("meta", False, "ids"), ("meta", True, ["ids", "x"]), ("meta",)]:
        assert devices(ours.send_to_device(batch, *args)) == devices(theirs.send_to_device(batch, *args))

    def fn(t: Any, scale: float, shift: float = 0.0) -> Any:
        return t * scale + shift

    data = {"a": torch.tensor([1.0, 2.0]), "b": (torch.tensor(3.0), "s")}
    mine, real = ours.recursively_apply(fn, data, 10.0, shift=1.0), theirs.recursively_apply(fn, data, 10.0, shift=1.0)
    assert mine["a"].tolist() == real["a"].tolist() and mine["b"][0].item() == real["b"][0].item()
    for impl in (ours, theirs):
        with pytest.raises(TypeError, match="Unsupported types"):
            impl.recursively_apply(fn, data, 1.0, error_on_other_type=True)

    model = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Linear(1, 1), torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.Tanh()])),
        torch.nn.Linear(1, 1),
    )
    for fqns in (False, True):
        assert ours.get_module_children_bottom_up(model, fqns) == theirs.get_module_children_bottom_up(model, fqns)

    class Wrap(torch.nn.Module):
        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

    for impl in (ours, theirs):
        inner = torch.nn.Linear(2, 2)
        body = torch.nn.Sequential(Wrap(inner), torch.nn.ReLU())
        out = impl.extract_model_from_parallel(body, recursive=True)
        assert out is body and body[0] is inner, impl.__name__
