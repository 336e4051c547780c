"""Run a script written for Accelerate unchanged, with `import accelerate` resolved to accel.

    python -m accel.as_accelerate train.py --lr 1e-3
    accel launch --num-processes 2 -m accel.as_accelerate train.py

Inside the script `accelerate` is `accel`, and `accelerate.X` is `accel.X`. A submodule accel
does not have resolves to its closest parent (`accelerate.utils.operations` -> `accel.utils`,
where accel keeps those names), so `from accelerate.utils.operations import gather` works.
`accelerate.test_utils` is the exception: when the real package is installed it is loaded
from there, as Accelerate's own test fixtures (they then import accel through the alias).

The alias also reaches every child process (torchrun workers, `notebook_launcher`'s processes,
multiprocessing spawns): the runner puts a one-file `accelerate` package first on
`PYTHONPATH` that installs the same alias.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .compat.borrowed import SHIM_DIR, real_accelerate_dir

__all__ = ["SHIM_DIR", "install", "main", "real_accelerate_dir"]

_FIXTURE_PACKAGES = ("accelerate.test_utils",)


class _ModuleView(ModuleType):
    """`accelerate.X` for an accel module that is not a package: a package-shaped view of it, so that
    `accelerate.utils.operations` (a submodule there, one module here) can still be imported."""

    def __init__(self, name: str, target: ModuleType) -> None:
        super().__init__(name, target.__doc__)
        self.__path__: list[str] = []
        self._target = target

    def __getattr__(self, name: str) -> Any:
        # accel's own name first; where accel has none (or only a stand-in that raises on use), the real
        # Accelerate's stateless helper of that name (accel.compat.borrowed), cached here.
        from .compat.borrowed import NOTHING, borrow
        from .compat.table import Unsupported

        try:
            value = getattr(self._target, name)
        except AttributeError:
            value = borrowed = borrow(self.__name__, name)
            if borrowed is NOTHING:
                raise
        else:
            if not isinstance(value, Unsupported):
                return value
            borrowed = borrow(self.__name__, name)
            value = value if borrowed is NOTHING else borrowed
        setattr(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        # The import system binds `accelerate.utils.tqdm` (the submodule) as `tqdm` on its parent; in
        # Accelerate the function re-exported under that name wins, so it must here too.
        if isinstance(value, ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            try:
                existing = self.__getattr__(name)
            except AttributeError:
                existing = None
            if existing is not None and not isinstance(existing, ModuleType):
                return
        super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return dir(self._target)


class _AliasLoader(importlib.abc.Loader):
    """Hands out the existing accel module (or a view of it) under the `accelerate` name."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        target = importlib.import_module(spec.loader_state)
        if hasattr(target, "__path__") and target.__name__ == "accel" + spec.name[len("accelerate") :]:
            return target
        return _ModuleView(spec.name, target)

    def exec_module(self, module: ModuleType) -> None:
        if isinstance(module, _ModuleView):
            return
        # The import system stamped the alias spec on the module; accel's own spec goes back.
        own = importlib.util.find_spec(module.__name__)
        if own is not None:
            module.__spec__ = own


FIXTURE_STUBS: dict[str, set[str]] = {}
"""Names Accelerate's fixtures imported from it that accel lacks, per importing fixture
module: they got stand-ins (`is_*_available` -> False, anything else raises when used)."""


class _Missing:
    """Stand-in for a name a fixture imports and accel lacks: using it raises."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"accel has no `{self.name}` (a test fixture of Accelerate used it)")


def _probe_false(*args: Any, **kwargs: Any) -> bool:
    return False


class _FixtureView(ModuleType):
    """What `from <accel module> import a, b` gives a fixture: the module, plus stand-ins for what it lacks."""

    def __init__(self, module: ModuleType, stubs: dict[str, Any]) -> None:
        super().__init__(module.__name__)
        self._module, self._stubs = module, stubs

    def __getattr__(self, name: str) -> Any:
        try:
            return getattr(self._module, name)
        except AttributeError:
            if name in self._stubs:
                return self._stubs[name]
            raise


class _FixtureLoader(importlib.machinery.SourceFileLoader):
    """Loads Accelerate's test fixtures; names they import from accel that accel lacks get
    stand-ins (recorded in `FIXTURE_STUBS`), so fixtures are not the thing that fails."""

    def exec_module(self, module: ModuleType) -> None:
        import builtins

        real_import = builtins.__import__
        owner = module.__name__

        def fixture_import(
            name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
        ) -> Any:
            imported = real_import(name, globals, locals, fromlist, level)
            if not fromlist or not getattr(imported, "__name__", "").startswith("accel"):
                return imported
            missing = [n for n in fromlist if n != "*" and not hasattr(imported, n)]
            missing = (
                [n for n in missing if importlib.util.find_spec(f"{imported.__name__}.{n}") is None]
                if (getattr(imported, "__path__", None) is not None)
                else missing
            )
            if not missing:
                return imported
            FIXTURE_STUBS.setdefault(owner, set()).update(missing)
            stubs = {n: _probe_false if n.startswith("is_") else _Missing(n) for n in missing}
            return _FixtureView(imported, stubs)

        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": fixture_import}
        super().exec_module(module)


class AccelerateAlias(importlib.abc.MetaPathFinder):
    """Meta-path finder resolving `accelerate` and `accelerate.X` to accel's modules."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "accelerate" and not fullname.startswith("accelerate."):
            return None
        if any(fullname == p or fullname.startswith(p + ".") for p in _FIXTURE_PACKAGES):
            real = real_accelerate_dir()
            if real is None:
                return None
            parts = fullname.split(".")[1:-1]
            spec = importlib.machinery.PathFinder.find_spec(fullname, [str(real.joinpath(*parts))])
            if spec is not None and isinstance(spec.loader, importlib.machinery.SourceFileLoader):
                spec.loader = _FixtureLoader(spec.loader.name, spec.loader.path)
            return spec
        if not _is_accelerate_module(fullname):
            # `from accelerate.utils import missing_name` tries a submodule of that name last:
            # no module, so the ImportError names the missing attribute.
            return None
        target_name = _REDIRECTS.get(fullname) or _closest_accel_module("accel" + fullname[len("accelerate") :])
        if target_name is None:
            raise ModuleNotFoundError(
                f"accel has no counterpart of `{fullname}`; docs/accelerate_compat.md lists what accel provides "
                "and what to use instead.",
                name=fullname,
            )
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(), loader_state=target_name)
        spec.submodule_search_locations = []
        return spec


_REDIRECTS = {"accelerate.commands.launch": "accel.compat.launch_command"}
"""Accelerate modules whose accel counterpart lives under another name."""

# Accelerate's module paths, for when it is not installed to look them up.
_KNOWN_MODULES = frozenset(
    [
        "accelerator",
        "big_modeling",
        "checkpointing",
        "commands",
        "data_loader",
        "hooks",
        "inference",
        "launchers",
        "local_sgd",
        "logging",
        "memory_utils",
        "optimizer",
        "parallelism_config",
        "scheduler",
        "state",
        "tracking",
        "utils",
        "utils.ao",
        "utils.bnb",
        "utils.constants",
        "utils.dataclasses",
        "utils.deepspeed",
        "utils.environment",
        "utils.fsdp_utils",
        "utils.imports",
        "utils.launch",
        "utils.megatron_lm",
        "utils.memory",
        "utils.modeling",
        "utils.offload",
        "utils.operations",
        "utils.other",
        "utils.random",
        "utils.rich",
        "utils.tqdm",
        "utils.transformer_engine",
        "utils.versions",
    ]
)


def _is_accelerate_module(fullname: str) -> bool:
    """Whether Accelerate has a module `fullname` (`accelerate` itself included)."""
    rest = fullname[len("accelerate.") :]
    if fullname == "accelerate" or rest in _KNOWN_MODULES:
        return True
    real = real_accelerate_dir()
    if real is None:
        return False
    path = real.joinpath(*rest.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _closest_accel_module(name: str) -> str | None:
    """`name` if accel has that module, else its nearest existing parent (None past `accel`)."""
    while name.startswith("accel"):
        try:
            if importlib.util.find_spec(name) is not None:
                return name
        except ModuleNotFoundError:  # a parent is a plain module, not a package
            pass
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return None


def _write_fixture_report() -> None:
    path = os.environ.get(FIXTURE_REPORT_ENV)
    if path and FIXTURE_STUBS:
        import json

        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({k: sorted(v) for k, v in FIXTURE_STUBS.items()}) + "\n")


MIRRORED_VERSION = "1.15.0"
"""The Accelerate release whose API accel mirrors: `accelerate.__version__` under the alias, so that
libraries gating on Accelerate's version (peft, trl) take the code path written for that API."""


def _top_level(accel: ModuleType) -> ModuleType:
    """`accelerate` itself: accel's names (and borrowed helpers), reporting the mirrored version."""
    top = _ModuleView("accelerate", accel)
    top.__version__ = MIRRORED_VERSION  # type: ignore[attr-defined]
    top.__spec__ = importlib.machinery.ModuleSpec("accelerate", _AliasLoader(), loader_state="accel", is_package=True)
    top.__file__ = accel.__file__
    return top


FIXTURE_REPORT_ENV = "ACCEL_AS_ACCELERATE_FIXTURE_REPORT"
"""If set, a file each process appends `FIXTURE_STUBS` to (one JSON line) at exit."""


def install() -> None:
    """Make `import accelerate` (and its submodules) resolve to accel in this process and its children."""
    import atexit

    import accel

    if not any(isinstance(f, AccelerateAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, AccelerateAlias())
        atexit.register(_write_fixture_report)
    for name in [n for n in sys.modules if n == "accelerate" or n.startswith("accelerate.")]:
        if not getattr(sys.modules[name], "__name__", "").startswith(("accel.", "accelerate.test_utils")):
            del sys.modules[name]
    sys.modules["accelerate"] = _top_level(accel)
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(SHIM_DIR) not in entries:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SHIM_DIR), *[e for e in entries if e]])


def main(argv: list[str] | None = None) -> None:
    """`python -m accel.as_accelerate SCRIPT [ARGS...]` or `... -m MODULE [ARGS...]`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if args else 2)
    install()
    if args[0] == "-m":
        if len(args) < 2:
            raise SystemExit("as_accelerate: -m needs a module name.")
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        return
    script = args[0]
    if not Path(script).is_file():
        raise SystemExit(f"as_accelerate: no such script: {script}")
    sys.argv = args
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
