"""The conformance kit's own parts: what it plans from capabilities, how it judges errors and
failed ranks, and that its emulation check catches an adapter whose decisions depend on `emulate`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from accel import Accelerator
from accel.adapter import Adapter, Capabilities
from accel.testing import AdapterConformanceSuite, KitRun, hardware_twin, module_tree
from accel.testing.catalogue import CASES, matches, run_case
from accel.testing.problems import build_model


class _Emulable(Adapter):
    name: ClassVar[str] = "emulable"
    hardware_device_type: ClassVar[str] = "pretenddev"


class _Honest(_Emulable):
    def prepare_model(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        return torch.nn.Sequential(super().prepare_model(model, ctx))


class _BranchesOnEmulate(_Emulable):
    def prepare_model(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        model = super().prepare_model(model, ctx)
        return model if self.emulate else torch.nn.Sequential(model)  # the anti-pattern


@pytest.mark.parametrize(("cls", "same"), [(_Honest, True), (_BranchesOnEmulate, False)])
def test_hardware_twin_exposes_decisions_that_depend_on_emulate(cls: type[Adapter], same: bool) -> None:
    ctx = Accelerator()._context(True)
    emulated = cls(emulate=True)
    twin = hardware_twin(emulated)
    assert twin.emulate is False and twin.device_type == "cpu" and twin.backend == "gloo"
    trees = module_tree(emulated.prepare_model(build_model(), ctx)), module_tree(twin.prepare_model(build_model(), ctx))
    assert (trees[0] == trees[1]) is same


def test_module_tree_shows_types_and_wrapped_forwards() -> None:
    acc = Accelerator(mixed_precision="bf16")
    tree = module_tree(acc.prepare(build_model()))
    assert tree[:2] == ["<root>: Sequential", "0: Linear"]
    assert "<root>: forward wrapped" in tree


class _Suite(AdapterConformanceSuite):
    adapter = "cpu"


def test_planned_checks_follow_the_capabilities() -> None:
    full = _Suite.planned_checks(
        Capabilities(precisions=frozenset({"no", "bf16", "fp16"}), strategies=frozenset({"ddp", "fsdp2"}), compile=True)
    )
    assert {"training:ddp", "training:fsdp2", "resume:fsdp2", "precision:bf16", "precision:fp16", "compile"} <= set(
        full
    )
    assert "unwrap_model:bf16" in full and "emulation" not in full  # cpu is available here: not emulated
    bare = _Suite.planned_checks(Capabilities())
    assert not any(n.startswith(("precision", "compile")) or n.endswith("fsdp2") for n in bare)
    assert "unwrap_model:no" in bare and "training:ddp" in bare


@pytest.mark.parametrize(
    ("device", "vendor_checks", "planned"),
    [("cpu", None, False), ("cpu", True, True), ("pretenddev", None, True), ("pretenddev", False, False)],
)
def test_vendor_checks_follow_the_device_unless_the_suite_says(
    device: str, vendor_checks: bool | None, planned: bool
) -> None:
    class Device(_Emulable):
        hardware_device_type: ClassVar[str] = device

    class Suite(_Suite):
        emulate = True

        @classmethod
        def adapter_class(cls) -> type[Adapter]:
            return Device

    Suite.vendor_checks = vendor_checks
    assert ("vendor" in Suite.planned_checks(Capabilities())) is planned
    why = Suite._vendor_checks_apply()
    assert (why is None) is planned
    if not planned:
        with pytest.raises(pytest.skip.Exception, match="vendor_checks"):
            Suite()._vendor(KitRun(1, Capabilities(), Path("."), [], ""))


def test_require_hardware_turns_emulation_into_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    class Emulated(_Suite):
        emulate = True

    assert Emulated.emulated() is True
    monkeypatch.setenv("ACCEL_KIT_REQUIRE_HARDWARE", "1")
    with pytest.raises(pytest.fail.Exception, match="would run emulated"):
        Emulated.emulated()
    assert _Suite.emulated() is False


def test_error_cases_are_judged_by_type_and_message(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "accumulation_steps_zero")
    report = run_case(case, tmp_path)
    assert matches(case, report)
    assert not matches(case, {**report, "mro": ["TypeError", "Exception"]})
    assert not matches(case, {**report, "message": "gradient_accumulation_steps is wrong"})
    assert not matches(case, {"type": "", "mro": [], "message": "nothing was raised"})


def test_a_rank_that_raised_fails_the_check_with_its_traceback(tmp_path: Path) -> None:
    run = KitRun(
        world=2,
        capabilities=Capabilities(),
        out=tmp_path,
        results=[{"sharding": {"ok": {"n": 1}}}, {"sharding": {"error": "Traceback ...\nValueError: boom"}}],
        launch_output="",
    )
    with pytest.raises(pytest.fail.Exception, match="rank 1:\nTraceback"):
        run.get("sharding")
    with pytest.raises(pytest.fail.Exception, match="did not finish on every rank"):
        KitRun(world=2, capabilities=Capabilities(), out=tmp_path, results=[{}], launch_output="").get("sharding")
