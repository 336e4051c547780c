"""accel's conformance kit: the suite every adapter passes, and the pieces it is built from.

An adapter package proves itself with one test file::

    from accel.testing import AdapterConformanceSuite

    class TestMyDeviceConformance(AdapterConformanceSuite):
        adapter = "mydevice"

`AdapterConformanceSuite` needs pytest; it is imported on first use so that the worker
processes (`accel.testing.worker`) never import pytest.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AdapterConformanceSuite", "KitRun", "KitWarning", "decision_record", "hardware_twin", "module_tree"]


def __getattr__(name: str) -> Any:
    if name in ("AdapterConformanceSuite", "KitRun", "KitWarning"):
        from . import suite

        return getattr(suite, name)
    if name in ("decision_record", "hardware_twin", "module_tree"):
        from . import checks_models

        return getattr(checks_models, name)
    raise AttributeError(f"module 'accel.testing' has no attribute {name!r}")
