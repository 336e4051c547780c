"""The kit's vendor checks (issue 18): an adapter whose device hooks reach its vendor module
passes them; the same adapter with every device hook deleted fails each, by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from accel.adapter.base import Adapter
from accel.testing import AdapterConformanceSuite, KitRun
from accel.testing.emulated import DeviceGenerators, current_device_setters, device_count_from_env, record_calls

FIXTURES = Path(__file__).parent / "kit_fixtures"
VENDOR_TESTS = (
    "test_vendor_device_made_current_before_process_group",
    "test_vendor_device_rng_is_seeded_consumed_and_restored",
    "test_vendor_module_is_used_by_the_hooks",
    "test_vendor_grad_scaler_is_used_under_fp16",
)
CLAIM_TESTS = (
    "test_claim_distributed_type_names_the_device",
    "test_claim_empty_cache_reaches_the_vendor_module",
    "test_claim_model_is_placed_on_the_device",
    "test_claim_scheduler_steps_the_optimizer_that_trains",
    "test_claim_optimizer_matches_adamw_with_weight_decay",
    "test_claim_autocast_device_and_backend_match_the_declaration",
    "test_claim_stand_in_has_the_real_vendor_functions",
)


def _classes() -> dict[str, type[Adapter]]:
    sys.path.insert(0, str(FIXTURES))
    try:
        from kit_leaky import LeakyNPUAdapter
        from kit_npu import planted
        from kit_npu.adapter import HollowNPUAdapter, RealNPUAdapter
    finally:
        sys.path.remove(str(FIXTURES))
    found = {"realnpu": RealNPUAdapter, "hollownpu": HollowNPUAdapter, "leakynpu": LeakyNPUAdapter}
    for value in vars(planted).values():
        if isinstance(value, type) and issubclass(value, Adapter) and value.__module__ == planted.__name__:
            found[value.name] = value
    return found


def _launch(adapter: str, out: Path) -> KitRun:
    cls = _classes()[adapter]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env.update(PYTHONPATH=os.pathsep.join([str(FIXTURES), env.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", "2", "--adapter", adapter, "--emulate"]
    # The leaky adapter only needs the vendor report (one launch less of the kit's other checks).
    extras = (
        []
        if adapter == "leakynpu"
        else ["emulation:kit_npu.kit_extras:conv_with_adam", "custom:kit_npu.kit_extras:rank_sum", "claims"]
    )
    cmd += ["--timeout", "120", "-m", "accel.testing.worker", str(out), "vendor", *extras]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2) if (out / f"rank{r}.json").is_file()]
    return KitRun(2, cls.capabilities, out, results, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")


def _suite(cls_name: str) -> AdapterConformanceSuite:
    class Kit(AdapterConformanceSuite):
        adapter: ClassVar[str] = cls_name
        emulate: ClassVar[bool | None] = True
        emulation_models = ("kit_npu.kit_extras:conv_with_adam",)
        extra_checks = ("kit_npu.kit_extras:rank_sum",)

        @classmethod
        def adapter_class(cls) -> type[Adapter]:
            return _classes()[cls_name]

    return Kit()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, KitRun]:
    return {name: _launch(name, tmp_path_factory.mktemp(name)) for name in ("realnpu", "hollownpu", "leakynpu")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("test", VENDOR_TESTS + CLAIM_TESTS)
def test_an_adapter_that_reaches_its_vendor_passes(runs: dict[str, KitRun], test: str) -> None:
    getattr(_suite("realnpu"), test)(runs["realnpu"])


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("test", "names"),
    [
        (VENDOR_TESTS[0], "kit_npu.npu_emulated.set_device was never called before the process group started"),
        (VENDOR_TESTS[1], "set_seed does not seed the device generators"),
        (VENDOR_TESTS[2], "manual_seed (set_seed) made no call into kit_npu.npu_emulated"),
        (VENDOR_TESTS[3], "kit_npu.npu_emulated.GradScaler exists but fp16 used GradScaler"),
    ],
)
def test_the_hollow_adapter_fails_each_vendor_check_by_name(runs: dict[str, KitRun], test: str, names: str) -> None:
    with pytest.raises(AssertionError) as failure:
        getattr(_suite("hollownpu"), test)(runs["hollownpu"])
    assert names in str(failure.value)


@pytest.mark.timeout(600)
def test_a_vendor_call_that_makes_no_device_current_fails(runs: dict[str, KitRun]) -> None:
    """No set_device, but device_for asks the stand-in for the device count before the process group:
    the kit names the setter that was never called, and says what was called instead."""
    leaky = runs["leakynpu"]
    for r in leaky.get("vendor"):
        assert [c["name"] for c in r["before_process_group"]][:1] == ["device_count"]
        assert r["device_setters"] == ["set_device"]
    with pytest.raises(AssertionError) as failure:
        _suite("leakynpu").test_vendor_device_made_current_before_process_group(leaky)
    message = str(failure.value)
    assert "rank 0: kit_npu.npu_emulated.set_device was never called before the process group started" in message
    assert "self.vendor.set_device(0)" in message and "['device_count'" in message


def test_the_real_adapter_makes_each_local_rank_current_from_its_set_device(runs: dict[str, KitRun]) -> None:
    for rank, r in enumerate(runs["realnpu"].get("vendor")):
        made = [c for c in r["before_process_group"] if c["name"] == "set_device"]
        assert made == [{"name": "set_device", "args": [rank], "hook": "set_device"}]


def _report(setters: list[str], *calls: tuple[str, list[object], str | None], rank: int = 1) -> KitRun:
    report = {"instrumented": True, "local_rank": rank, "emulated_vendor_module": "v_emulated"}
    report["device_setters"] = setters
    report["before_process_group"] = [{"name": n, "args": a, "hook": h} for n, a, h in calls]
    return KitRun(1, _classes()["realnpu"].capabilities, Path("."), [{"vendor": {"ok": report}}], "")


@pytest.mark.parametrize(
    ("setters", "calls", "failure"),
    [
        (["set_device"], [("set_device", [1], "set_device")], None),
        (["set_device"], [("set_device", [{"device": "npu", "index": 1}], "before_process_group")], None),
        (["set_device"], [("set_device", [0], "set_device")], r"made current with index \[0\], not the local rank"),
        (["set_device"], [("set_device", [], "set_device")], "set_device was called without a device index"),
        (["set_device"], [("device_count", [], None)], r"v_emulated\.set_device was never called"),
        (["bind"], [("bind", [], "set_device")], None),  # a declared setter that takes no index
        # No setter (one device per process): a call from the device hooks stands for it ...
        ([], [("init_distributed", [], "set_device")], None),
        ([], [("register_backend", [], "before_process_group")], None),
        # ... a call from anywhere else does not.
        ([], [("device_count", [], None)], "hooks made no call into v_emulated before the process group"),
        ([], [], r"before the process group: none"),
    ],
)
def test_made_current_judges_the_setter_and_the_index(
    setters: list[str], calls: list[tuple[str, list[object], str | None]], failure: str | None
) -> None:
    check = _suite("realnpu").test_vendor_device_made_current_before_process_group
    if failure is None:
        check(_report(setters, *calls))
    else:
        with pytest.raises(AssertionError, match=failure):
            check(_report(setters, *calls))


def test_hollow_rng_failure_names_load_state_once_seeding_works(runs: dict[str, KitRun]) -> None:
    """With seeding faked good, the next missing piece (restore) is the one named."""
    rng = runs["hollownpu"].get("vendor")[0]["rng"]
    assert rng["consumed_by_training"], "the kit's training must draw from the device generator"
    assert not rng["resumed_equal"], "without set_device_rng_state, resuming cannot replay the device dropout"


def test_an_adapter_without_a_stand_in_fails_naming_it() -> None:
    run = KitRun(
        1,
        _suite("hollownpu").adapter_class().capabilities,
        Path("."),
        [{"vendor": {"ok": {"instrumented": False}}}],
        "",
    )
    with pytest.raises(pytest.fail.Exception, match="declares no emulated vendor module"):
        _suite("hollownpu").test_vendor_module_is_used_by_the_hooks(run)


def test_stand_in_base_records_calls_and_restores_generators() -> None:
    import types

    module = types.ModuleType("fake_vendor")
    exec("def set_device(i):\n    return i * 2\n", module.__dict__)
    module.generator = DeviceGenerators(2).generator  # a bound method exposed as a function is recorded too
    module.imported = torch.manual_seed  # an imported function is not
    record = record_calls(module)
    assert module.set_device(3) == 6 and record.names() == ["set_device"] and record.calls[0].args == (3,)
    assert isinstance(module.generator(1), torch.Generator) and record.names() == ["set_device", "generator"]
    module.imported(0)
    assert record.names() == ["set_device", "generator"]
    del record.calls[1]
    with record.within("before_process_group"):
        module.set_device(1)
    assert [c.hook for c in record.calls] == [None, "before_process_group"] and record.hooks == []
    assert record_calls(module) is record  # idempotent: never wrapped twice
    assert current_device_setters(module) == ("set_device",)
    module.CURRENT_DEVICE_SETTERS = ()
    assert current_device_setters(module) == ()
    assert current_device_setters(types.ModuleType("no_setter")) == ()
    gens = DeviceGenerators(2)
    gens.manual_seed(5)
    state = gens.get_rng_state()
    a = torch.rand(3, generator=gens.generator(1))
    gens.set_rng_state(state)
    assert torch.equal(a, torch.rand(3, generator=gens.generator(1)))
    assert torch.equal(a, torch.rand(3, generator=torch.Generator().manual_seed(5)))


def test_device_count_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert device_count_from_env() == 3 and device_count_from_env("NPU_VISIBLE_DEVICES") == 3
    monkeypatch.setenv("NPU_VISIBLE_DEVICES", "0,1")
    assert device_count_from_env("NPU_VISIBLE_DEVICES") == 2
    monkeypatch.setenv("NPU_VISIBLE_DEVICES", "-1")
    assert device_count_from_env("NPU_VISIBLE_DEVICES") == 0


# ---- extension points (issue 18 item 2) ------------------------------------------------------------------


def test_adapter_models_and_checks_run_in_the_kit(runs: dict[str, KitRun]) -> None:
    kit = _suite("realnpu")
    kit.test_emulation_makes_the_hardware_decisions(runs["realnpu"])
    [report] = runs["realnpu"].get("emulation:kit_npu.kit_extras:conv_with_adam")[:1]
    assert [m["model"] for m in report["models"]] == ["kit MLP", "kit_npu.kit_extras:conv_with_adam"]
    assert report["models"][1]["emulated"]["record"]["optimizer"] == "Adam"
    assert [r["sum"] for r in kit.custom_results(runs["realnpu"], "kit_npu.kit_extras:rank_sum")] == [3.0, 3.0]
    with pytest.raises(ValueError, match=r"not in Kit\.extra_checks"):
        kit.custom_results(runs["realnpu"], "kit_npu.kit_extras:other")


def test_decision_record_catches_what_the_module_tree_cannot() -> None:
    """Fused flags and memory formats gated on `emulate` leave the module tree equal; the record differs."""
    from accel import Accelerator
    from accel.testing import hardware_twin
    from accel.testing.checks_models import _decisions

    sys.path.insert(0, str(FIXTURES))
    try:
        from kit_npu.adapter import GatedNPUAdapter, RealNPUAdapter
        from kit_npu.kit_extras import conv_with_adam
    finally:
        sys.path.remove(str(FIXTURES))
    ctx = Accelerator(cpu=True)._run(device_placement=True)
    for cls, same in ((RealNPUAdapter, True), (GatedNPUAdapter, False)):
        emulated = cls(emulate=True)
        a, b = _decisions(emulated, ctx, conv_with_adam), _decisions(hardware_twin(emulated), ctx, conv_with_adam)
        assert a["tree"] == b["tree"]
        assert (a["record"] == b["record"]) is same
    assert b["record"]["optimizer_flags"]["fused"] is True and a["record"]["optimizer_flags"]["fused"] is None
    assert b["record"]["parameters"]["0.weight"] == "float32 channels_last"
    assert a["record"]["parameters"]["0.weight"] == "float32 contiguous" and a["record"]["adapter"] == {
        "vendor_layers": 0
    }


def test_the_contract_reference_is_current() -> None:
    """docs/adapter_contract.md is generated from the docstrings; a stale page fails here."""
    from accel.testing import contract_doc

    page = Path(__file__).parents[3] / "docs" / "adapter_contract.md"
    assert contract_doc.main([str(page), "--check"]) == 0, (
        "docs/adapter_contract.md is stale: run `python -m accel.testing.contract_doc docs/adapter_contract.md`"
    )
    text = page.read_text()
    for hook in ("set_device", "before_process_group", "process_group_options", "barrier", "describe"):
        assert f"| `{hook}` |" in text
    assert "| `launch_args` |" in text and "| `emulation_models` |" in text
    adapter_rows = text.split("## `Adapter`")[1].split("## Optional hooks")[0].splitlines()
    rows = [r for r in adapter_rows if r.startswith("| `")]
    assert len(rows) >= 57  # every Adapter member (backward and no_sync went to strategies)
    for row in rows:  # every member says when it runs (or who reads it); every method its base behaviour
        assert "**Runs from:**" in row or "**Read by:**" in row, row
        if "**Runs from:**" in row:
            assert "**Base:**" in row, row
    assert "| `decision_record` | `decision_record(self, model: torch.nn.Module" in text
    context = text.split("## `RunContext`")[1].split("## `AdapterConformanceSuite` options")[0]
    assert (
        "`accelerator.Accelerator._run`" in context and "`places_model` (from `prepare.walk.convert_model`)" in context
    )
    for field in ("device", "strategy", "precision", "optimizers", "kwargs_handlers"):
        assert f"| `{field}` |" in context


def test_the_kit_check_column_comes_from_the_suite_declarations() -> None:
    """Each declared member exists (on Adapter or as an optional hook) and each declared check is a worker check."""
    from accel.testing import checks_models, checks_vendor  # noqa: F401  (register their checks)
    from accel.testing.checks import CHECKS
    from accel.testing.suite import AdapterConformanceSuite, declared_kit_checks

    declared = declared_kit_checks()
    members = set(vars(Adapter)) | {"decision_record"}
    assert set(declared) <= members, set(declared) - members
    assert "test_vendor_device_made_current_before_process_group" in declared["set_device"]
    assert declared["clip_grad_norm_"] == ["test_clip_grad_norm_matches_direct_computation"]
    for value in vars(AdapterConformanceSuite).values():
        function = value.__func__ if isinstance(value, classmethod) else value
        check, _ = getattr(function, "__accel_kit_checks__", ("process_state", ()))
        assert check in CHECKS, check


def test_when_it_runs_and_the_default_are_read_from_the_code() -> None:
    from accel.testing.contract_doc import base_behaviour, call_sites

    sites = call_sites({"before_process_group", "place_model", "default_strategy", "priority"})
    assert sites["before_process_group"] == {"distributed.state.PartialState._init_process_group"}
    assert sites["place_model"] == {"prepare.walk.convert_model"}  # the core's walk, never another adapter hook
    assert (
        "distributed.state.AcceleratorState.__init__" in sites["default_strategy"]
    )  # `chosen = self._partial.adapter`
    assert "adapter.registry.select_adapter" in sites["priority"]  # the registry's `c.priority`

    def nothing(self: Any) -> None:
        """Docstring only."""

    def one(self: Any, x: int) -> int:
        return x + 1

    def raises(self: Any) -> None:
        raise NotImplementedError("no")

    assert base_behaviour(nothing) == "does nothing"
    assert base_behaviour(one) == "returns `x + 1`"
    assert base_behaviour(raises) == "raises `NotImplementedError`"
    assert "calling the vendor module's `set_rng_state`" in base_behaviour(Adapter.set_device_rng_state)


def test_the_reusable_kit_workflow_is_validated() -> None:
    """hardware_ci/validate.py accepts .github/workflows/adapter-kit.yml and names what a broken copy lacks."""
    import importlib.util

    import yaml

    root = Path(__file__).parents[3]
    spec = importlib.util.spec_from_file_location("hw_validate", root / "hardware_ci" / "validate.py")
    assert spec is not None and spec.loader is not None
    validate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(validate)
    workflow = yaml.safe_load((root / ".github" / "workflows" / "adapter-kit.yml").read_text())
    assert validate.adapter_kit_problems(workflow) == []
    del workflow[True]["workflow_call"]["inputs"]["adapter"]
    job = workflow["jobs"]["kit"]
    job["env"].pop("ACCEL_KIT_REQUIRE_HARDWARE")
    job["steps"] = [s for s in job["steps"] if "upload-artifact" not in str(s.get("uses", ""))]
    found = "\n".join(validate.adapter_kit_problems(workflow))
    assert "needs 'adapter'" in found and "ACCEL_KIT_REQUIRE_HARDWARE=1" in found and "uploads no report" in found


def test_decision_record_reads_flags_set_on_a_param_group() -> None:
    """A vendor that switches a fused kernel per parameter group (`group["fused"] = True`) is compared too."""
    from accel.testing import decision_record

    model = torch.nn.Linear(2, 2)
    plain = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grouped = torch.optim.AdamW(model.parameters(), lr=1e-3)
    grouped.param_groups[0]["fused"] = True
    a, b = decision_record(model, plain), decision_record(model, grouped)
    assert a["optimizer_flags"] == {"fused": None, "foreach": None, "capturable": False}
    assert b["optimizer_flags"] == {**a["optimizer_flags"], "group0.fused": True}


def test_the_guide_calls_the_reusable_workflow_with_inputs_it_has() -> None:
    """docs/adapters.md's hardware.yml: no placeholders, only inputs the workflow declares (the required
    ones given), and an accel-base range that this accel-base satisfies."""
    import re

    import yaml
    from accel import __version__
    from packaging.specifiers import SpecifierSet

    root = Path(__file__).parents[3]
    guide = (root / "docs" / "adapters.md").read_text()
    block = guide.split("Then add\n`.github/workflows/hardware.yml`:", 1)[1]
    example = yaml.safe_load(re.search(r"```yaml\n(.*?)```", block, re.S).group(1))  # type: ignore[union-attr]
    call = example["jobs"]["kit"]
    assert call["uses"] == "./.github/workflows/adapter-kit.yml"
    assert not re.search(r"<[a-z-]+>|OWNER|@v\d", yaml.safe_dump(example)), "placeholders left in the example"
    inputs = yaml.safe_load((root / ".github" / "workflows" / "adapter-kit.yml").read_text())[True]["workflow_call"]
    declared = inputs["inputs"]
    assert set(call["with"]) <= set(declared), set(call["with"]) - set(declared)
    assert {name for name, spec in declared.items() if spec.get("required")} <= set(call["with"])
    requirement = call["with"]["accel-version"]
    assert requirement.startswith("accel-base")
    assert __version__ in SpecifierSet(requirement.removeprefix("accel-base")), (requirement, __version__)


# ---- kit v3 (issue 32): every claim emulation can observe, planted bugs, contract versions --------------------

PLANTED = [
    ("bug_distributed_type", CLAIM_TESTS[0], "wrong DistributedType: data_parallel_name = 'MULTI_GPU'"),
    ("bug_empty_cache", CLAIM_TESTS[1], "empty_cache (free_memory) made no call into the adapter's vendor module"),
    ("bug_host_model", CLAIM_TESTS[2], "model left on the host"),
    ("bug_after_prepare", CLAIM_TESTS[3], "the scheduler steps another optimizer"),
    ("bug_coupled_decay", CLAIM_TESTS[4], "does not train like torch.optim.AdamW with weight decay"),
    ("bug_autocast", CLAIM_TESTS[5], "autocast on the wrong device type: the adapter's autocast asked for ['cuda']"),
    ("bug_backend", CLAIM_TESTS[5], "wrong collective backend: off emulation the adapter's backend is 'nccl'"),
    ("bug_stand_in_names", CLAIM_TESTS[6], "stand-in names differ from the real vendor module: "),
]


@pytest.fixture(scope="module")
def installed_fixtures() -> Any:
    """The fixture adapters as installed packages (their dist-info on sys.path), for in-process runs."""
    from accel.adapter import registry

    sys.path.insert(0, str(FIXTURES))
    registry.clear_cache()
    try:
        yield
    finally:
        sys.path.remove(str(FIXTURES))
        registry.clear_cache()


def _claims_run(name: str) -> KitRun:
    """The kit's `claims` check run in this process on the emulated adapter `name` (one process)."""
    from accel import Accelerator
    from accel.adapter import registry
    from accel.distributed.state import AcceleratorState, GradientState
    from accel.testing.checks_claims import claims_report

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        report = claims_report(Accelerator(adapter=name, emulate=True))
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    return KitRun(1, registry.get_adapter_class(name).capabilities, Path("."), [{"claims": {"ok": report}}], "")


@pytest.mark.parametrize("test", CLAIM_TESTS)
def test_the_correct_adapter_passes_every_claim_check(installed_fixtures: None, test: str) -> None:
    getattr(_suite("realnpu"), test)(_claims_run("realnpu"))


@pytest.mark.parametrize(("adapter", "test", "names"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_bug_fails_the_kit_naming_it(installed_fixtures: None, adapter: str, test: str, names: str) -> None:
    run = _claims_run(adapter)
    with pytest.raises(AssertionError) as failure:
        getattr(_suite(adapter), test)(run)
    assert names in str(failure.value)
    # ... and only the check of that claim fails (a scheduler decaying an optimizer nobody steps also changes
    # the numbers): the others pass on the same adapter.
    also = {CLAIM_TESTS[4]} if adapter == "bug_after_prepare" else set()
    for other in set(CLAIM_TESTS) - {test} - also:
        getattr(_suite(adapter), other)(run)


def test_the_planted_optimizer_bugs_are_off_by_what_the_issue_measured(installed_fixtures: None) -> None:
    """The scheduler decays an optimizer nobody steps (reported lr 0.01/1.1, used 0.01); coupled decay drifts."""
    lrs = _claims_run("bug_after_prepare").get("claims")[0]["optimizer"]["lrs"]
    assert lrs[0] == pytest.approx((0.01 / 1.1, 0.01)) and lrs[-1][1] == 0.01
    assert _claims_run("bug_coupled_decay").get("claims")[0]["optimizer"]["max_abs_diff"] > 1e-4


def test_a_fused_switch_skipped_under_emulation_fails_on_the_kit_model(installed_fixtures: None) -> None:
    """The emulation-decision check now prepares the kit's MLP with AdamW: an optimizer flag set only on the
    hardware twin shows without any model of the adapter's own."""
    from accel import Accelerator
    from accel.testing import hardware_twin
    from accel.testing.checks_models import _decisions, _mlp_with_adamw
    from kit_npu.adapter import GatedNPUAdapter, RealNPUAdapter

    ctx = Accelerator(cpu=True)._run(device_placement=True)
    for cls, same in ((RealNPUAdapter, True), (GatedNPUAdapter, False)):
        emulated = cls(emulate=True)
        a, b = _decisions(emulated, ctx, _mlp_with_adamw), _decisions(hardware_twin(emulated), ctx, _mlp_with_adamw)
        assert (a["record"]["optimizer_flags"] == b["record"]["optimizer_flags"]) is same


@pytest.mark.parametrize("name", ["npuv1", "npuv2"])
def test_adapters_written_for_contract_one_and_two_pass(installed_fixtures: None, name: str) -> None:
    """Without `generator(index)` (optional: a warning, the calls still checked) and, for version 1, without
    `data_parallel_name` (added in version 2: a warning); every other claim holds them as it holds version 3."""
    from accel.testing.suite import KitWarning

    run = _claims_run(name)
    suite = _suite(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for test in CLAIM_TESTS:
            getattr(suite, test)(run)
    said = [str(w.message) for w in caught if issubclass(w.category, KitWarning)]
    assert any("data_parallel_name" in s for s in said) is (name == "npuv1"), said
    assert not any("cannot compare" in s for s in said), said  # the stand-in declares REAL_FUNCTIONS


def test_a_stand_in_without_generator_warns_and_checks_the_calls(installed_fixtures: None) -> None:
    """The device-RNG check on a version-1 stand-in: a KitWarning, and a hook that never reaches the stand-in
    still fails."""
    from accel.testing.suite import KitWarning

    calls = {"set_seed_calls": ["manual_seed"], "save_state_calls": ["get_rng_state"], "load_state_calls": []}
    report = {"instrumented": True, "emulated_vendor_module": "kit_npu.npu_v1", "has_generator": False}
    run = KitRun(1, _classes()["realnpu"].capabilities, Path("."), [{"vendor": {"ok": {**report, "rng": calls}}}], "")
    with pytest.warns(KitWarning, match="has no `generator"), pytest.raises(AssertionError, match="load_state"):
        _suite("npuv1").test_vendor_device_rng_is_seeded_consumed_and_restored(run)
    calls["load_state_calls"] = ["set_rng_state"]
    with pytest.warns(KitWarning, match="checks only that set_seed, save_state and load_state call"):
        _suite("npuv1").test_vendor_device_rng_is_seeded_consumed_and_restored(run)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
    env.update(PYTHONPATH=os.pathsep.join([str(FIXTURES), env.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    return env


@pytest.mark.timeout(120)
def test_a_rank_failing_before_the_process_group_ends_the_run_with_its_error(tmp_path: Path) -> None:
    """The device count read from the wrong variable: rank 1 fails in device_for, rank 0 waits in the
    rendezvous. The kit's run ends at once (not after its 1200 s timeout), and every test shows rank 1's error."""
    import time

    from accel.testing.suite import run_kit_launch

    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", "2", "--adapter", "bug_device_count"]
    cmd += ["--emulate", "--timeout", "120", "-m", "accel.testing.worker", str(tmp_path), "process_state", "claims"]
    start = time.monotonic()
    run = run_kit_launch(cmd, _env(), tmp_path, 2, _classes()["bug_device_count"].capabilities, timeout=1200)
    assert time.monotonic() - start < 60, run.launch_output
    assert "rank 1 failed before the process group formed (check 'process_state')" in run.launch_output
    with pytest.raises(pytest.fail.Exception) as failure:
        run.get("claims")
    message = str(failure.value)
    assert "rank 1 failed before the process group formed, in check 'process_state'" in message
    assert "ValueError: NPU 1 is not visible (NPU_VISIBLE_DEVICES)" in message


@pytest.mark.timeout(120)
def test_a_rank_left_waiting_for_one_that_exited_is_ended(tmp_path: Path) -> None:
    """Rank 1 finishes and exits; rank 0 never returns. The kit ends the launch `grace` seconds after rank 1
    finished, and says so."""
    import time

    from accel.testing.suite import run_kit_launch

    script = tmp_path / "stuck.py"
    script.write_text(
        "import json, os, sys, threading\n"
        "if os.environ['RANK'] == '1':\n"
        "    open(os.path.join(sys.argv[1], 'rank1.json'), 'w').write(json.dumps({'x': {'ok': 1}}))\n"
        "else:\n"
        "    threading.Event().wait()\n"
    )
    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", "2", str(script), str(tmp_path)]
    start = time.monotonic()
    run = run_kit_launch(cmd, _env(), tmp_path, 2, _classes()["realnpu"].capabilities, timeout=1200, grace=3)
    assert time.monotonic() - start < 60
    assert "the kit ended the run: ranks [1] finished, the others were still running 3 s later" in run.launch_output
    with pytest.raises(pytest.fail.Exception, match="did not finish on every rank"):
        run.get("x")


@pytest.mark.parametrize("name", ["npuv1", "npuv2"])
def test_contract_one_and_two_stand_ins_pass_the_vendor_checks(
    installed_fixtures: None, name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kit's `vendor` check run in this process (one rank) on a stand-in without `generator(index)`: the
    device made current, the RNG hooks reaching the stand-in; a KitWarning says what was not checked."""
    from accel.distributed.state import AcceleratorState, GradientState
    from accel.testing import checks_vendor
    from accel.testing.suite import KitWarning

    monkeypatch.setenv("ACCEL_ADAPTER", name)
    monkeypatch.setenv("ACCEL_EMULATE", "1")
    monkeypatch.setattr(checks_vendor, "_RECORD", None)
    monkeypatch.setattr(checks_vendor, "_SETTERS", ())
    cls = _classes()[name]
    for hook in checks_vendor.DEVICE_HOOKS:  # instrument_vendor tags them in place: undone after the test
        monkeypatch.setattr(cls, hook, getattr(cls, hook))
    checks_vendor.instrument_vendor()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    try:
        report = checks_vendor.vendor(tmp_path, "")
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert report["has_generator"] is False and "set_rng_state" in report["rng"]["load_state_calls"]
    run = KitRun(1, cls.capabilities, tmp_path, [{"vendor": {"ok": report}}], "")
    suite = _suite(name)
    suite.test_vendor_device_made_current_before_process_group(run)
    suite.test_vendor_module_is_used_by_the_hooks(run)
    with pytest.warns(KitWarning, match="has no `generator"):
        suite.test_vendor_device_rng_is_seeded_consumed_and_restored(run)
