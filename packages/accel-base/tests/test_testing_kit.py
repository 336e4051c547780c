"""The conformance kit's own parts: what it plans from capabilities, how it judges errors and
failed ranks, and that its emulation check catches an adapter whose decisions depend on `emulate`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from accel import Accelerator
from accel.adapter.base import Adapter, Capabilities
from accel.prepare.walk import model_walk
from accel.testing import AdapterConformanceSuite, KitRun, hardware_twin, module_tree
from accel.testing.catalogue import CASES, matches, run_case
from accel.testing.problems import build_model


class _Emulable(Adapter):
    name: ClassVar[str] = "emulable"
    hardware_device_type: ClassVar[str] = "pretenddev"


class _Honest(_Emulable):
    def optimize_model(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        return torch.nn.Sequential(model)


class _BranchesOnEmulate(_Emulable):
    def optimize_model(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        return model if self.emulate else torch.nn.Sequential(model)  # the anti-pattern


@pytest.mark.parametrize(("cls", "same"), [(_Honest, True), (_BranchesOnEmulate, False)])
def test_hardware_twin_exposes_decisions_that_depend_on_emulate(cls: type[Adapter], same: bool) -> None:
    ctx = Accelerator()._run(device_placement=True)
    emulated = cls(emulate=True)
    twin = hardware_twin(emulated)
    assert twin.emulate is False and twin.device_type == "cpu" and twin.backend == "gloo"
    trees = tuple(module_tree(model_walk(build_model(), replace(ctx, adapter=a))) for a in (emulated, twin))
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


@pytest.mark.parametrize(
    ("parallelism", "processes", "expected"),
    [
        (frozenset({"tp", "hsdp", "cp"}), None, ["parallel:tp", "parallel:hsdp"]),
        (frozenset({"hsdp"}), None, ["parallel:hsdp"]),
        (frozenset(), None, []),
        (frozenset({"tp", "hsdp"}), 1, []),  # one process: nothing to split over
    ],
)
def test_parallel_checks_follow_the_claims(parallelism: frozenset[str], processes: int | None, expected: list) -> None:
    class Suite(_Suite):
        pass

    Suite.processes = processes
    planned = Suite.planned_checks(Capabilities(strategies=frozenset({"ddp", "fsdp2"}), parallelism=parallelism))
    assert [n for n in planned if n.startswith("parallel")] == expected


def _parallel_run(tmp_path: Path, kind: str, losses: list[float], mesh: dict[str, int]) -> KitRun:
    from accel.testing.checks import TRAIN_STEPS
    from accel.testing.suite import _reference_losses

    ref_losses, params = _reference_losses(TRAIN_STEPS, 1 if kind == "tp" else 2)
    rank = {
        "losses": losses or ref_losses.tolist(),
        "params": params.tolist(),
        "data_shards": 1 if kind == "tp" else 2,
        "mesh_device_type": "cpu",
        "mesh": mesh,
        "dtensor_params": 4,
    }
    state = {"ok": {"device_type": "cpu"}}
    caps = Capabilities(strategies=frozenset({"ddp", "fsdp2"}), parallelism=frozenset({"tp", "hsdp"}))
    results = [{f"parallel:{kind}": {"ok": rank}, "process_state": state} for _ in range(2)]
    return KitRun(world=2, capabilities=caps, out=tmp_path, results=results, launch_output="")


def test_parallel_check_is_judged_against_one_process(tmp_path: Path) -> None:
    from accel.testing.checks import TRAIN_STEPS

    # The reference is one process of plain SGD: its weights are reference_sgd's.
    from accel.testing.problems import reference_sgd
    from accel.testing.suite import _reference_losses

    assert torch.equal(_reference_losses(TRAIN_STEPS, 2)[1], reference_sgd(TRAIN_STEPS, 2))
    suite = _Suite()
    suite.test_parallelism_trains_like_one_process(_parallel_run(tmp_path, "tp", [], {"tp": 2}), "tp")
    suite.test_parallelism_trains_like_one_process(_parallel_run(tmp_path, "hsdp", [], {"dp_shard": 2}), "hsdp")
    ref = _reference_losses(TRAIN_STEPS, 1)[0].tolist()
    off = [ref[0], ref[1] + 3e-5, ref[2]]  # a loss 3e-5 away from one process fails
    with pytest.raises(AssertionError):
        suite.test_parallelism_trains_like_one_process(_parallel_run(tmp_path, "tp", off, {"tp": 2}), "tp")
    with pytest.raises(AssertionError):  # the wrong mesh (TP run as data parallelism) fails
        suite.test_parallelism_trains_like_one_process(_parallel_run(tmp_path, "tp", [], {"dp_shard": 2}), "tp")
    unclaimed = _parallel_run(tmp_path, "tp", [], {"tp": 2})
    unclaimed.capabilities = Capabilities()
    with pytest.raises(pytest.skip.Exception, match="does not claim 'tp'"):
        suite.test_parallelism_trains_like_one_process(unclaimed, "tp")


def test_context_parallelism_without_a_gpu_is_skipped_with_the_reason(tmp_path: Path) -> None:
    run = _parallel_run(tmp_path, "tp", [], {"tp": 2})
    run.capabilities = Capabilities(parallelism=frozenset({"cp"}))
    with pytest.raises(pytest.skip.Exception, match="context parallelism needs the adapter's GPU"):
        _Suite().test_context_parallelism(run)
    run.capabilities = Capabilities()
    with pytest.raises(pytest.skip.Exception, match="does not claim 'cp'"):
        _Suite().test_context_parallelism(run)
