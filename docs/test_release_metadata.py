"""Every package ships the Apache-2.0 license its metadata declares, with classifiers for its registry page."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGES = sorted(p.parent for p in ROOT.glob("packages/*/pyproject.toml"))

# Packages owned by other engineers whose pyproject has not taken the license file and
# classifiers yet. Each entry must still lack them (the test fails once fixed, so the entry
# goes with the fix).
PENDING: set[str] = set()


def project(package: Path) -> dict:
    return tomllib.loads((package / "pyproject.toml").read_text())["project"]


def is_complete(package: Path) -> bool:
    meta = project(package)
    return meta.get("license") == "Apache-2.0" and meta.get("license-files") == ["LICENSE"] and "classifiers" in meta


def test_the_root_license_is_the_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text
    assert len(text.split()) > 1500, "the full license text, not a notice"


def test_every_package_ships_the_license_its_metadata_declares() -> None:
    assert len(PACKAGES) == 6, [p.name for p in PACKAGES]
    license_text = (ROOT / "LICENSE").read_text()
    for package in PACKAGES:
        if package.name in PENDING:
            continue
        meta = project(package)
        assert meta["license"] == "Apache-2.0", package.name  # an SPDX expression (PEP 639)
        assert meta["license-files"] == ["LICENSE"], package.name
        # A wheel can only carry files inside its project folder: each package has its own copy.
        assert (package / "LICENSE").read_text() == license_text, f"{package.name}/LICENSE differs from LICENSE"
        build = tomllib.loads((package / "pyproject.toml").read_text())["build-system"]
        assert "hatchling>=1.27" in build["requires"], f"{package.name}: PEP 639 metadata needs hatchling 1.27"


def test_classifiers_agree_with_requires_python() -> None:
    for package in PACKAGES:
        if package.name in PENDING:
            continue
        meta = project(package)
        assert meta["requires-python"] == ">=3.10"
        versions = [
            c.rsplit(" :: ", 1)[1] for c in meta["classifiers"] if c.startswith("Programming Language :: Python :: 3.")
        ]
        assert versions and min(versions, key=lambda v: tuple(map(int, v.split(".")))) == "3.10", package.name
        assert not any(c.startswith("License ::") for c in meta["classifiers"]), "PEP 639: the license expression only"


def test_pending_packages_are_still_pending() -> None:
    fixed = sorted(name for name in PENDING if is_complete(ROOT / "packages" / name))
    assert not fixed, f"{fixed} now carry the license metadata: remove them from PENDING"
