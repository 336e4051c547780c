"""The joints of the core stay where docs/architecture.md puts them.

- No import cycle in accel-base, counting every import (function-level ones too) except
  those under `TYPE_CHECKING`.
- Strategies and checkpoints never receive the Accelerator: their hooks take the registry
  of prepared objects and the frozen run context.
"""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path

import accel
import pytest
from accel import accelerator as accelerator_module
from accel.checkpoint import state as checkpoint
from accel.strategies.base import Strategy

SRC = Path(accel.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.dump(node.test)
        for n in ast.walk(node)
    }
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules]
            # `from . import sub` needs the submodule, not the rest of the package.
            targets = subs if len(subs) == len(node.names) else [target, *subs]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in SRC.rglob("*.py")}
    return {name: _imports(path, set(paths)) for name, path in paths.items()}


# Circles still open, each to be broken where it belongs (then deleted here: the test fails
# when one listed here is gone, so this list only shrinks). None today: the last one
# (accelerate_env -> strategies.fsdp -> state -> accelerate_env) went when the FSDP2 mesh builder
# began taking its facts from the Accelerator's state (parallelism_config.bind_parallelism)
# instead of reading PartialState() itself.
KNOWN_CYCLES: set[str] = set()


def test_no_import_cycle_in_accel_base() -> None:
    # A function-local import counts: deferring an import hides a circle, it does not remove it.
    # Move the shared piece to a leaf module or to the lower of the two modules instead.
    graph = _graph()
    found = {" <-> ".join(c): {m: sorted(graph[m] & set(c)) for m in c} for c in _cycles(graph)}
    assert {name: edges for name, edges in found.items() if name not in KNOWN_CYCLES} == {}
    assert KNOWN_CYCLES - set(found) == set(), "a listed circle is gone: delete it from KNOWN_CYCLES"


def test_the_import_graph_counts_function_local_imports_but_not_type_checking_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .high import H\n\ndef f():\n    from . import leaf\n"
    )
    (package / "high.py").write_text("from .low import f\n")
    (package / "leaf.py").write_text("def g():\n    from pkg import high\n")
    monkeypatch.setattr(sys.modules[__name__], "SRC", package)
    modules = {"pkg", "pkg.low", "pkg.high", "pkg.leaf"}
    assert _imports(package / "low.py", modules) == {"pkg.leaf"}
    assert _imports(package / "high.py", modules) == {"pkg.low"}
    assert _imports(package / "leaf.py", modules) == {"pkg.high"}
    graph = {m: _imports(package / (m.split(".")[-1] + ".py"), modules) for m in modules - {"pkg"}}
    assert _cycles(graph) == [["pkg.high", "pkg.leaf", "pkg.low"]]


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


HOOKS = [
    "validate_prepare",
    "setup",
    "backward",
    "clip_grad_norm_",
    "save_checkpoint_state",
    "load_checkpoint_state",
    "loads_checkpoint_models",
]


@pytest.mark.parametrize("hook", HOOKS)
def test_strategy_hooks_never_take_the_accelerator(hook: str) -> None:
    assert "accelerator" not in inspect.signature(getattr(Strategy, hook)).parameters


def test_pairing_has_one_strategy_entry_and_gradients_no_adapter_hook() -> None:
    """A strategy pairs models with optimizers and schedulers only in `setup`; the backward pass and
    pausing gradient synchronisation are the strategy's alone (the adapter has no such hooks)."""
    from accel.adapter.base import REMOVED_ADAPTER_HOOKS, Adapter
    from accel.strategies.base import REMOVED_STRATEGY_HOOKS

    assert not any(hasattr(Strategy, hook) for hook in REMOVED_STRATEGY_HOOKS)
    assert set(REMOVED_STRATEGY_HOOKS) == {"prepare_optimizer", "prepare_scheduler", "after_prepare"}
    assert not any(hasattr(Adapter, hook) for hook in REMOVED_ADAPTER_HOOKS)
    assert set(REMOVED_ADAPTER_HOOKS) == {"backward", "no_sync"}
    source = inspect.getsource(accelerator_module)
    for call in ("adapter.backward(", "adapter.no_sync(", "strategy.prepare_optimizer(", "strategy.after_prepare("):
        assert call not in source, call


def test_checkpoints_never_take_the_accelerator() -> None:
    for fn in (checkpoint.save_state, checkpoint.load_state):
        params = list(inspect.signature(fn).parameters)
        assert params[:2] == ["prepared", "ctx"], params


# ---- the house: folders by concern, a one-way compatibility layer, no vendor in the core ----------
ENGINE = ("prepare", "adapter", "precision", "strategies", "data", "checkpoint", "distributed", "trackers", "settings")
"""The engine's folders. They import one another and `accel.errors`, never the edge: `compat/` (Accelerate's
names and translation), `commands/` (the CLI), `testing/` (the kit) or the public modules at the top."""
PUBLIC_MODULES = 15
"""At most this many modules at the top of `accel/`: Accelerate's module paths users import and accel's entry points."""
FOLDER_MODULES = 17
"""At most this many modules in one folder."""


def _engine(module: str) -> bool:
    parts = module.split(".")
    return len(parts) > 1 and parts[1] in ENGINE


def test_engine_folders_never_import_the_edge() -> None:
    # Counted on every import (function-local ones too; not those under TYPE_CHECKING): the engine reaches
    # Accelerate's names, the CLI or the public modules only through what the edge hands it.
    graph = _graph()
    edges = {
        (module, target)
        for module, targets in graph.items()
        if _engine(module)
        for target in targets
        if not _engine(target) and target != "accel.errors"
    }
    assert edges == set()


def test_top_level_keeps_only_the_public_surface_and_no_folder_is_crowded() -> None:
    top = sorted(p.stem for p in SRC.glob("*.py"))
    assert len(top) <= PUBLIC_MODULES, top
    for folder in [p for p in SRC.rglob("*") if p.is_dir() and p.name != "__pycache__"]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= FOLDER_MODULES, (folder, len(modules))


PACKAGES = Path(__file__).resolve().parents[2]
VENDORS = ("cuda", "nvidia", "habana", "gaudi", "hpu", "xla", "tpu", "ipex", "intel", "megatron")


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_core_imports_no_adapter_package_and_no_adapter_imports_another() -> None:
    core = {str(p.relative_to(SRC)): _imported_roots(p) & {"accel_" + v for v in VENDORS} for p in SRC.rglob("*.py")}
    assert {path: found for path, found in core.items() if found} == {}
    adapters = sorted(p.name.replace("-", "_") for p in PACKAGES.glob("accel-*") if p.name != "accel-base")
    assert len(adapters) >= 5
    for package in adapters:
        src = PACKAGES / package.replace("_", "-") / "src" / package
        for path in src.rglob("*.py"):
            others = _imported_roots(path) & (set(adapters) - {package})
            assert not others, (path, others)


def test_adapters_answer_and_never_call_a_strategy() -> None:
    # The core drives the prepare walk: an adapter's module never reaches the run's strategy.
    for path in PACKAGES.glob("accel-*/src/accel_*/adapter.py"):
        text = path.read_text()
        for reach in ("ctx.strategy", ".wrap_model(", ".prepare_group(", ".setup(", "step_needs_reduction"):
            assert reach not in text, (path, reach)
    base = (SRC / "adapter" / "base.py").read_text()
    assert "ctx.strategy" not in base and "Precision.of(" not in base


DOCUMENTED_PATHS = [
    ("accel", "Accelerator"),
    ("accel.state", "AcceleratorState"),
    ("accel.state", "PartialState"),
    ("accel.state", "GradientState"),
    ("accel.utils", "set_seed"),
    ("accel.utils", "ParallelismConfig"),
    ("accel.data_loader", "DataLoaderShard"),
    ("accel.tracking", "GeneralTracker"),
    ("accel.optimizer", "AcceleratedOptimizer"),
    ("accel.scheduler", "AcceleratedScheduler"),
    ("accel.logging", "get_logger"),
    ("accel.local_sgd", "LocalSGD"),
    ("accel.launchers", "notebook_launcher"),
    ("accel.errors", "CompileNotSupportedError"),
    ("accel.adapter", "Adapter"),
    ("accel.adapter", "Capabilities"),
    ("accel.adapter.options", "AdapterOptions"),
    ("accel.prepare", "PrepareContext"),
    ("accel.prepare", "RunContext"),
    ("accel.prepare.prepared", "Prepared"),
    ("accel.strategies.base", "Strategy"),
    ("accel.strategies.deepspeed", "DeepSpeedPlugin"),
    ("accel.precision", "Precision"),
    ("accel.testing", "AdapterConformanceSuite"),
    ("accel.testing.emulated", "record_calls"),
]


@pytest.mark.parametrize(("module", "name"), DOCUMENTED_PATHS)
def test_every_documented_import_path_works(module: str, name: str) -> None:
    import importlib

    assert getattr(importlib.import_module(module), name) is not None


def test_the_flat_module_paths_of_before_still_import_with_a_warning() -> None:
    import importlib

    from accel.compat.moved import MOVED

    for old, new in MOVED.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=f"^{old} moved to {new}; import it from there"):
            module = importlib.import_module(old)
        assert module is importlib.import_module(new), old
    from accel.prepared import Prepared, RunContext  # the form an adapter of contract 2 used

    assert RunContext is importlib.import_module("accel.prepare.context").RunContext
    assert Prepared is importlib.import_module("accel.prepare.prepared").Prepared
