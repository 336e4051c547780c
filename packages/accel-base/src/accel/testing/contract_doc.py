"""Writes docs/adapter_contract.md, the adapter contract reference, from the code's docstrings.

    python -m accel.testing.contract_doc docs/adapter_contract.md          # write it
    python -m accel.testing.contract_doc docs/adapter_contract.md --check  # exit 1 if it is stale

Every public hook and class attribute of `accel.adapter.Adapter` (signature, docstring, the core
functions that call it and what the base implementation does, both read from the code), the suite
tests that judge it (their `kit_checks` declarations), the optional hooks the kit reads, the
`PrepareContext` handed to the prepare hooks, and the options of `AdapterConformanceSuite`. A test in
accel-base runs `--check`, so the page cannot drift.
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

from ..adapter.base import Adapter

CORE = Path(__file__).resolve().parents[1]
"""The core's package folder (accel/), whose code the "runs from" text is read from."""
# Receivers that hold an adapter class where the code does not say so in the name (registry and
# the launch command keep the class in `cls`/`c`, `PluginRecord.loaded`).
ADAPTER_CLASS_NAMES = {"adapter.registry": {"cls", "c", "loaded"}, "commands.launch": {"cls"}, "commands.env": {"cls"}}
FIELD_NOTES = {
    "mixed_precision": 'The run\'s precision ("no", "bf16", "fp16", "fp8").',
    "autocast_kwargs": "Keyword arguments for `Adapter.autocast` (from `AutocastKwargs`).",
    "strategy": "The run's strategy (for strategies and checkpoints; an adapter answers, it never calls the strategy).",
    "use_distributed": "Whether several processes run (a process group exists).",
    "num_processes": "How many processes run.",
    "process_index": "This process's global rank.",
    "ddp_kwargs": "The user's `DistributedDataParallelKwargs`, if any.",
    "ddp_device_ids": "`Adapter.ddp_device_ids(device)`, computed once.",
    "dynamo_plugin": "The torch.compile settings (`TorchDynamoPlugin`), if any; the walk reads it.",
    "adapter": "The run's adapter.",
    "local_process_index": "This process's rank on its node.",
    "is_main_process": "Whether this is the process of global rank 0.",
    "is_local_main_process": "Whether this is the process of rank 0 on its node.",
}
"""Used only for a `RunContext` field that has no docstring of its own in accel/prepare/context.py."""


def _attribute_docs(cls: type) -> dict[str, str]:
    """Docstrings written under class attributes (`name: T = v` then a string), read from the source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, following in zip(body, [*body[1:], None]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
        ):
            docs[node.target.id] = inspect.cleandoc(str(following.value.value))
    return docs


def _one_line(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _receiver_is_adapter(node: ast.expr, names: set[str]) -> bool:
    last = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return last is not None and ("adapter" in last.lower() or last in names)


def call_sites(members: set[str]) -> dict[str, set[str]]:
    """Where the core (accel/, not accel/testing/) calls or reads each `Adapter` member, as
    `module.Class.function`: `adapter.<member>` (any name containing "adapter", a parameter annotated
    with `Adapter`, a local assigned from one), `self.<member>` inside `Adapter` itself, and the
    adapter classes the registry and the launcher hold in `cls`."""
    sites: dict[str, set[str]] = {}

    class Visitor(ast.NodeVisitor):
        def __init__(self, module: str) -> None:
            self.module = module
            self.stack: list[str] = []
            self.names = [ADAPTER_CLASS_NAMES.get(module, set())]

        def visit_ClassDef(self, node: ast.ClassDef) -> None:
            self.stack.append(node.name)
            self.generic_visit(node)
            self.stack.pop()

        def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
            names = set(self.names[-1])
            for arg in node.args.args + node.args.kwonlyargs:
                if arg.annotation is not None and "Adapter" in ast.unparse(arg.annotation):
                    names.add(arg.arg)
            if self.module == "adapter" and self.stack[:1] == ["Adapter"]:
                names |= {"self", "cls"}
            self.stack.append(node.name)
            self.names.append(names)
            self.generic_visit(node)
            self.names.pop()
            self.stack.pop()

        visit_AsyncFunctionDef = visit_FunctionDef

        def visit_Assign(self, node: ast.Assign) -> None:  # chosen = self.adapter
            self.generic_visit(node)
            if isinstance(node.value, (ast.Name, ast.Attribute)) and _receiver_is_adapter(node.value, self.names[-1]):
                self.names[-1].update(t.id for t in node.targets if isinstance(t, ast.Name))

        def _add(self, member: str) -> None:
            sites.setdefault(member, set()).add(".".join([self.module, *self.stack]))

        def visit_Attribute(self, node: ast.Attribute) -> None:
            if node.attr in members and _receiver_is_adapter(node.value, self.names[-1]):
                self._add(node.attr)
            self.generic_visit(node)

        def visit_Call(self, node: ast.Call) -> None:  # getattr(adapter, "member", ...)
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and _receiver_is_adapter(node.args[0], self.names[-1])
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in members
            ):
                self._add(str(node.args[1].value))
            self.generic_visit(node)

    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(CORE).with_suffix("").parts
        if parts[0] == "testing":
            continue
        module = ".".join(p for p in parts if p != "__init__") or "accel"
        Visitor(module).visit(ast.parse(path.read_text()))
    return sites


def _runs_from(sites: set[str], name: str) -> str:
    own = sorted(s.removeprefix("adapter.Adapter.") for s in sites if s.startswith("adapter.Adapter."))
    own = [s for s in own if s != name]
    core = sorted(s for s in sites if not s.startswith("adapter."))
    parts = []
    if core:
        parts.append(", ".join(f"`{s}`" for s in core))
    if own:
        parts.append("the base " + ", ".join(f"`{s}`" for s in own))
    return "; ".join(parts)


def base_behaviour(function: Any) -> str:
    """What the base implementation does, read from its code: nothing, the one expression it
    returns, what it raises, or (longer bodies) the members and vendor functions it calls."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if not body or all(isinstance(b, ast.Pass) for b in body):
        return "does nothing"
    if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
        code = ast.unparse(body[0].value)
        if len(code) <= 110:
            return f"returns `{code}`"
    if len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None:
        exc = body[0].exc
        return f"raises `{ast.unparse(exc.func if isinstance(exc, ast.Call) else exc)}`"
    if len(body) == 1 and isinstance(body[0], ast.Expr):
        code = ast.unparse(body[0])
        if len(code) <= 110:
            return f"`{code}`"
    called = []
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
                first = node.args[0] if node.args else None
                if func.attr == "_forward" and isinstance(first, ast.Constant) and isinstance(first.value, str):
                    called.append(f"the vendor module's `{first.value}`")
                elif not func.attr.startswith("_"):
                    called.append(f"`self.{func.attr}`")
    lines = len(inspect.getsource(function).splitlines())
    calls = f", calling {', '.join(dict.fromkeys(called))}" if called else ""
    return f"{lines} lines in accel/adapter/{Path(inspect.getfile(function)).name}{calls}"


def _members(cls: type) -> list[tuple[str, str, str]]:
    """(name, signature or annotation, doc) for every public member defined on `cls`."""
    attr_docs = _attribute_docs(cls)
    rows = []
    for name, value in cls.__dict__.items():
        if name.startswith("_"):
            continue
        raw = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        if isinstance(raw, property):
            annotation = inspect.signature(raw.fget).return_annotation if raw.fget else ""
            rows.append((name, f"(property) {name} -> {annotation}", inspect.getdoc(raw) or ""))
        elif inspect.isfunction(raw):
            prefix = "classmethod " if isinstance(value, classmethod) else ""
            sig = str(inspect.signature(raw)).replace("'", "")
            rows.append((name, f"{prefix}{name}{sig}", inspect.getdoc(raw) or ""))
        elif name in attr_docs or name in cls.__annotations__:
            annotation = cls.__annotations__.get(name, "")
            rows.append((name, f"{name}: {annotation} = {value!r}", attr_docs.get(name, "")))
    return rows


def _adapter_rows() -> list[str]:
    from .suite import declared_kit_checks

    kit = declared_kit_checks()
    rows = _members(Adapter)
    sites = call_sites({name for name, _, _ in rows})
    lines = []
    for name, sig, doc in rows:
        raw = Adapter.__dict__[name]
        raw = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
        text = [doc] if doc else []
        runs = _runs_from(sites.get(name, set()), name)
        if inspect.isfunction(raw):
            text.append(f"**Runs from:** {runs or 'no caller in the core'}.")
            text.append(f"**Base:** {base_behaviour(raw)}.")
        elif isinstance(raw, property):
            text.append(f"**Read by:** {runs or '-'}.")
            text.append(f"**Base:** {base_behaviour(raw.fget)}.")
        else:
            text.append(f"**Read by:** {runs or 'the adapter itself'}.")
        checks = ", ".join(f"`{t}`" for t in kit.get(name, [])) or "-"
        lines.append(f"| `{name}` | `{_one_line(sig)}` | {_one_line(' '.join(text))} | {checks} |")
    return lines


def _optional_rows() -> list[str]:
    from .checks_models import AdapterDecisionRecord
    from .suite import declared_kit_checks

    kit = declared_kit_checks()
    lines = []
    for name, sig, doc in _members(AdapterDecisionRecord):
        checks = ", ".join(f"`{t}`" for t in kit.get(name, [])) or "-"
        lines.append(f"| `{name}` | `{_one_line(sig)}` | {_one_line(doc)} | {checks} |")
    return lines


def _prepare_context_rows() -> list[str]:
    import dataclasses

    from ..prepare.context import RunContext

    docs = _attribute_docs(RunContext)
    lines = []
    for f in dataclasses.fields(RunContext):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        doc = docs.get(f.name) or FIELD_NOTES.get(f.name, "-")
        lines.append(f"| `{f.name}` | `{_one_line(str(f.type))}` | `{_one_line(default)}` | {_one_line(doc)} |")
    for name, sig, doc in _members(RunContext):
        if sig.startswith(f"{name}(self"):
            lines.append(f"| `{name}` | `{_one_line(sig)}` | method | {_one_line(doc)} |")
    return lines


def _handed_to() -> str:
    """The hooks that take a `RunContext`, with where the core calls them, and where it is built."""
    takes = [
        name
        for name, value in Adapter.__dict__.items()
        if inspect.isfunction(value) and "RunContext" in str(inspect.signature(value))
    ]
    sites = call_sites(set(takes))
    builders = sorted(f"`{site}`" for site in _constructed_in("RunContext") if not site.startswith("testing."))
    hooks = "; ".join(f"`{name}` (from {_runs_from(sites.get(name, set()), name) or '-'})" for name in takes)
    return (
        f"The core builds one per call ({', '.join(builders)}) and hands it, read-only, to: {hooks}. "
        "It is built anew for each hook call, so an adapter keeps nothing it needs later on it."
    )


def _constructed_in(class_name: str) -> set[str]:
    """Where the core calls `class_name(...)`, as `module.Class.function`."""
    found: set[str] = set()
    for path in sorted(CORE.rglob("*.py")):
        module = ".".join(path.relative_to(CORE).with_suffix("").parts)
        tree = ast.parse(path.read_text())
        for outer in ast.walk(tree):
            if isinstance(outer, ast.ClassDef):
                for node in outer.body:
                    if isinstance(node, ast.FunctionDef) and any(
                        isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == class_name
                        for c in ast.walk(node)
                    ):
                        found.add(f"{module}.{outer.name}.{node.name}")
    return found


def render() -> str:
    """The page's Markdown."""
    from .suite import AdapterConformanceSuite

    lines = [
        "# Adapter contract reference",
        "",
        "<!-- Generated by `python -m accel.testing.contract_doc docs/adapter_contract.md` from the",
        "code of accel.adapter.Adapter, accel.prepare.RunContext and accel.testing; do not edit. -->",
        "",
        "Every hook and class attribute of `accel.adapter.Adapter`, in source order: its signature; what it does",
        "(its docstring); **Runs from**, the core functions that call it (read from the core's code); **Base**,",
        "what the base implementation does (read from its code); and the conformance-kit tests that judge it",
        "(declared on each test with `accel.testing.suite.kit_checks`). The guide is [adapters.md](adapters.md).",
        "",
        "## `Adapter`",
        "",
        "| Member | Signature | When it runs, default | Kit check |",
        "|---|---|---|---|",
        *_adapter_rows(),
        "",
        "## Optional hooks",
        "",
        "Methods the kit calls when an adapter defines them; `Adapter` has no base implementation.",
        "",
        "| Member | Signature | When it runs, default | Kit check |",
        "|---|---|---|---|",
        *_optional_rows(),
        "",
        "## `RunContext`",
        "",
        "`accel.prepare.RunContext` (also `accel.prepare.PrepareContext`, the name of contract versions 1 and 2)",
        "is the object handed to the adapter's hooks (`ctx`), to strategies and to checkpoints: the run as the",
        "Accelerator decided it, frozen, with the facts of the object being prepared. " + _handed_to(),
        "",
        "| Field | Type | Default | Meaning |",
        "|---|---|---|---|",
        *_prepare_context_rows(),
        "",
        "## `AdapterConformanceSuite` options",
        "",
        "Class attributes an adapter's test class sets (`class TestMine(AdapterConformanceSuite): adapter = 'mine'`).",
        "",
        "| Option | Default | Meaning |",
        "|---|---|---|",
    ]
    for name, sig, doc in _members(AdapterConformanceSuite):
        if sig.startswith(f"{name}:"):
            default = sig.split(" = ", 1)[1]
            lines.append(f"| `{name}` | `{_one_line(default)}` | {_one_line(doc)} |")
    lines += ["", "## Helpers for an adapter's own checks", ""]
    from . import checks_models, emulated

    helpers: list[Any] = [
        checks_models.module_tree,
        checks_models.hardware_twin,
        checks_models.decision_record,
        AdapterConformanceSuite.custom_results,
        emulated.DeviceGenerators,
        emulated.device_count_from_env,
        emulated.record_calls,
        emulated.current_device_setters,
    ]
    for helper in helpers:
        doc = (inspect.getdoc(helper) or "").split("\n\n")[0]
        lines.append(f"- `{helper.__module__}.{helper.__qualname__}`: {_one_line(doc)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python -m accel.testing.contract_doc PATH [--check]", file=sys.stderr)
        return 2
    path, text = Path(argv[0]), render()
    if "--check" in argv[1:]:
        if not path.is_file() or path.read_text() != text:
            print(f"{path} is out of date: run `python -m accel.testing.contract_doc {path}`", file=sys.stderr)
            return 1
        return 0
    path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
