"""The release checks fail on what they are meant to catch (`nox -s build` runs this file).

check_dists.py is given distribution folders made here (wheels are zip files with a METADATA
member), and hardware_ci/validate.py's release rules are given mutated copies of the real
release workflow.
"""

from __future__ import annotations

import copy
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parents[1] / "hardware_ci")]

import check_dists  # noqa: E402
import validate  # noqa: E402

VERSION = check_dists.project_version()
NAMES = sorted(p.parent.name for p in check_dists.ROOT.glob("packages/*/pyproject.toml"))


def make_dists(folder: Path, version: str = str(VERSION), base_range: str | None = None) -> Path:
    """Every package's sdist and wheel at `version`; adapters require accel-base `base_range`."""
    major, minor = VERSION.major, VERSION.minor
    base_range = base_range or f">={major}.{minor},<{major}.{minor + 1}"
    for name in NAMES:
        stem = f"{name.replace('-', '_')}-{version}"
        (folder / f"{stem}.tar.gz").write_bytes(b"")
        requires = "" if name == "accel-base" else f"Requires-Dist: accel-base{base_range}\n"
        with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as zf:
            zf.writestr(
                f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.4\nName: {name}\nVersion: {version}\n{requires}"
            )
    return folder


def test_agreeing_distributions_pass(tmp_path: Path) -> None:
    assert check_dists.problems(make_dists(tmp_path), tag=f"v{VERSION}") == []


def test_a_range_admitting_the_next_minor_fails(tmp_path: Path) -> None:
    wide = f">={VERSION.major}.{VERSION.minor},<{VERSION.major}.{VERSION.minor + 2}"
    found = check_dists.problems(make_dists(tmp_path, base_range=wide))
    assert len(found) == len(NAMES) - 1, found
    assert all("must admit" in f for f in found)


def test_a_range_excluding_the_version_fails(tmp_path: Path) -> None:
    found = check_dists.problems(make_dists(tmp_path, base_range=f"<{VERSION.major}.{VERSION.minor}"))
    assert len(found) == len(NAMES) - 1, found


def test_another_version_or_a_stale_file_or_a_wrong_tag_fails(tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    assert any("is missing" in f for f in check_dists.problems(make_dists(other, version="0.0.1")))
    folder = make_dists(tmp_path)
    (folder / "accel_base-0.0.1.tar.gz").write_bytes(b"")
    assert any("not one of this version's" in f for f in check_dists.problems(folder))
    (folder / "accel_base-0.0.1.tar.gz").unlink()
    assert any("does not name this version" in f for f in check_dists.problems(folder, tag="v0.0.1"))


RELEASE = yaml.safe_load(validate.RELEASE.read_text())


def mutated(change) -> list[str]:  # type: ignore[no-untyped-def]
    workflow = copy.deepcopy(RELEASE)
    change(workflow)
    return validate.release_problems(workflow)


def test_the_release_workflow_passes() -> None:
    assert validate.release_problems(copy.deepcopy(RELEASE)) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda w: w["jobs"]["publish"].pop("permissions"), "id-token: write"),
        (lambda w: w["jobs"]["publish"].pop("needs"), "must `needs:`"),
        (lambda w: w.__setitem__(True, {"push": {"branches": ["main"]}}), "pushed `v*` tag"),
        (lambda w: w["jobs"]["build"]["steps"].pop(3), "nox -s build"),
        (lambda w: w["jobs"]["publish"]["steps"][1]["with"].__setitem__("password", "x"), "passes a token"),
        (lambda w: w.__setitem__("permissions", {"id-token": "write"}), "publishing job only"),
    ],
)
def test_each_release_rule_catches_its_mistake(change, expected: str) -> None:  # type: ignore[no-untyped-def]
    found = mutated(change)
    assert any(expected in f for f in found), found
