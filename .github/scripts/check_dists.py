"""Checks a folder of built distributions before they are installed or published.

    python .github/scripts/check_dists.py dist/ [--tag v0.1.0]

Every package under packages/ must have exactly one sdist and one wheel, all at the one
version the project has (`__version__` in accel-base's `accel/__init__.py`, which every
pyproject.toml reads), and every adapter's dependency on accel-base must admit that
version and no other minor release; a package that also states `__version__` in its
`__init__.py` must state the same one. With `--tag` (the release workflow passes the pushed
tag), the tag must be `v` and that version. Exits 1 and says what is wrong.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).parents[2]
VERSION_FILE = ROOT / "packages" / "accel-base" / "src" / "accel" / "__init__.py"


def project_version() -> Version:
    match = re.search(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(), re.M)
    if not match:
        raise SystemExit(f'{VERSION_FILE}: no `__version__ = "..."` line')
    return Version(match.group(1))


def wheel_metadata(wheel: Path) -> tuple[str, list[str]]:
    """The wheel's Version and Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(zf.read(name).decode())
    return headers["Version"], headers.get_all("Requires-Dist") or []


def problems(dist: Path, tag: str | None = None) -> list[str]:
    version = project_version()
    next_minor = Version(f"{version.major}.{version.minor + 1}.0")
    found = []
    if tag is not None and tag != f"v{version}":
        found.append(f"tag {tag!r} does not name this version: tag v{version}, or set __version__ in {VERSION_FILE}")
    expected: set[str] = set()
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text())["project"]
        name = project["name"]
        if "version" in project or "version" not in project.get("dynamic", []):
            found.append(f"{pyproject}: the version must be dynamic (read from {VERSION_FILE.relative_to(ROOT)})")
        stem = f"{name.replace('-', '_')}-{version}"
        sdist, wheel = dist / f"{stem}.tar.gz", dist / f"{stem}-py3-none-any.whl"
        expected |= {sdist.name, wheel.name}
        for path in (sdist, wheel):
            if not path.is_file():
                found.append(f"{name}: {path.name} is missing from {dist}")
        if not wheel.is_file():
            continue
        wheel_version, requires = wheel_metadata(wheel)
        if Version(wheel_version) != version:
            found.append(f"{wheel.name}: Version {wheel_version}, expected {version}")
        if name == "accel-base":
            continue
        base = [Requirement(r) for r in requires if Requirement(r).name == "accel-base"]
        if len(base) != 1:
            found.append(f"{name}: needs exactly one accel-base requirement, has {len(base)}")
            continue
        spec = base[0].specifier
        if version not in spec or next_minor in spec:
            found.append(
                f"{name}: requires accel-base{spec}, which must admit {version} and exclude {next_minor}: "
                f'write "accel-base>={version.major}.{version.minor},<{next_minor.major}.{next_minor.minor}" '
                f"in {pyproject.relative_to(ROOT)}"
            )
    for init in sorted(ROOT.glob("packages/*/src/*/__init__.py")):
        stated = re.search(r'^__version__ = "([^"]+)"$', init.read_text(), re.M)
        if stated and Version(stated.group(1)) != version:
            found.append(f"{init.relative_to(ROOT)}: __version__ {stated.group(1)}, expected {version}")
    for extra in sorted({p.name for p in dist.iterdir()} - expected):
        found.append(f"{dist}: {extra} is not one of this version's distributions (remove it)")
    return found


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dist", nargs="?", default="dist", help="the folder of built distributions")
    parser.add_argument("--tag", help="the release tag, which must be v<version>")
    args = parser.parse_args()
    folder = Path(args.dist)
    errors = problems(folder, args.tag)
    print("\n".join(errors) or f"{len(list(folder.iterdir()))} distributions at {project_version()} agree")
    sys.exit(1 if errors else 0)
