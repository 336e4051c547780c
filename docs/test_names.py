"""User-facing text names Accelerate and optimum-habana instead of "the peer library" / "the seed library".

Error messages, docstrings and the documentation site are read by people who never saw the
project's internal shorthand; this test keeps it from coming back. Text is searched with its
line breaks and comment markers folded away, so a phrase split over two lines is still found.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]

SHORTHAND = re.compile(r"\b(peer|seed)[- ](library|libraries|project|package)\b", re.I)

# Files that may still carry the phrase while someone fixes them (none now). Each entry must still
# match (the test fails once it is fixed, so the entry is removed with the fix).
# docs/accelerate_compat.md is generated from accel/compat_table.py (compat_tests/gen_compat_table.py).
PENDING: set[str] = set()


def user_facing_files() -> list[Path]:
    """Sources of the packages, their READMEs, the docs site and the root documents."""
    files = [p for p in ROOT.glob("packages/*/src/**/*.py")]
    files += ROOT.glob("packages/*/README.md")
    files += [p for p in (ROOT / "docs").rglob("*") if p.suffix in (".md", ".py", ".yml") and p.is_file()]
    files += [ROOT / name for name in ("README.md", "CHANGELOG.md", "mkdocs.yml") if (ROOT / name).is_file()]
    return sorted(set(files))


def shorthand_in(path: Path) -> list[str]:
    """The shorthand phrases in `path`, found across line breaks and `#` comment continuations."""
    text = re.sub(r"\s+(#+\s*)?", " ", path.read_text(encoding="utf-8"))
    return [m.group(0) for m in SHORTHAND.finditer(text)]


def test_the_shorthand_finder_sees_phrases_split_over_lines_and_comments(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Seeded as the peer\n    library does."""\n# kept as the seed\n# library pads\nx = 1  # peer rank\n'
    )
    assert shorthand_in(sample) == ["peer library", "seed library"]


def test_user_facing_text_names_accelerate_rather_than_the_peer_library() -> None:
    files = user_facing_files()
    assert any(p.name == "table.py" and p.parent.name == "compat" for p in files), (
        "the search must cover packages/*/src"
    )
    assert any(p.name == "guide.md" for p in files), "the search must cover docs/"
    found = {
        str(p.relative_to(ROOT)): hits for p in files if p.name != Path(__file__).name and (hits := shorthand_in(p))
    }
    unexpected = {path: hits for path, hits in found.items() if path not in PENDING}
    assert not unexpected, f"name Accelerate or optimum-habana instead of the shorthand in: {unexpected}"
    fixed = sorted(PENDING - set(found))
    assert not fixed, f"no shorthand left in {fixed}: remove them from PENDING in {Path(__file__).name}"


def test_an_unsupported_name_says_which_library_it_comes_from() -> None:
    import accel.utils

    try:
        accel.utils.cpu_offload(None)
    except NotImplementedError as exc:
        message = str(exc)
    else:
        raise AssertionError("accel.utils.cpu_offload must raise NotImplementedError")
    assert message.startswith("`accelerate.utils.cpu_offload` is not supported by accel: big-model inference")
    assert "keep using Accelerate's `big_modeling` for inference" in message
    assert not SHORTHAND.search(message)
