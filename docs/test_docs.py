"""The adapter guide shows the example adapter's files as they are on disk."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```\w*\n(?P<body>.*?)```", re.S)


def test_every_file_shown_in_the_guide_is_the_file_on_disk() -> None:
    shown = {m["path"]: m["body"] for m in BLOCK.finditer((ROOT / "docs" / "adapters.md").read_text())}
    example = ROOT / "docs" / "examples" / "accel-example-adapter"
    on_disk = {str(p.relative_to(ROOT)) for p in example.rglob("*") if p.is_file() and p.suffix in (".py", ".toml")}
    assert set(shown) == on_disk, "the guide must show every file of the example, and only those"
    for path, body in shown.items():
        assert (ROOT / path).read_text() == body, f"{path} differs from what docs/adapters.md shows"


API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: (?P<name>[\w.]+)\s*$", re.M)


def documented() -> set[str]:
    """Every object the API reference renders (`::: name` lines of docs/api/*.md)."""
    return {m["name"] for page in API.glob("*.md") for m in DIRECTIVE.finditer(page.read_text())}


def static_all(path: Path) -> list[str]:
    """A module's `__all__`, read without importing it (adapter packages need their hardware's libraries)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [name for name in ast.literal_eval(node.value) if not name.startswith("__")]
    raise AssertionError(f"{path} has no __all__")


def test_every_public_name_of_accel_has_an_api_reference_entry() -> None:
    import accel
    import accel.tracking

    shown = documented()
    missing = [f"accel.{name}" for name in accel.__all__ if f"accel.{name}" not in shown]
    missing += [f"accel.tracking.{name}" for name in accel.tracking.__all__ if f"accel.tracking.{name}" not in shown]
    assert not missing, f"add a `::: name` entry to a page of docs/api for {missing}"


def test_every_adapter_package_s_public_names_have_api_reference_entries() -> None:
    shown = documented()
    packages = sorted(ROOT.glob("packages/accel-*/src/accel_*/__init__.py"))
    assert len(packages) >= 5, "the adapter packages' __init__ files must be found"
    missing = [f"{p.parent.name}.{n}" for p in packages for n in static_all(p) if f"{p.parent.name}.{n}" not in shown]
    assert not missing, f"add a `::: name` entry to a page of docs/api for {missing}"
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in packages:
        assert str(path.parents[1].relative_to(ROOT)) in nav, f"mkdocstrings `paths` must list {path.parents[1]}"


def test_the_api_check_sees_a_name_without_an_entry(tmp_path: Path) -> None:
    module = tmp_path / "__init__.py"
    module.write_text('__all__ = ["Documented", "__version__", "Forgotten"]\n')
    names = static_all(module)
    assert names == ["Documented", "Forgotten"]
    assert "accel.Accelerator" in documented() and "accel.Forgotten" not in documented()
