"""`AdapterConformanceSuite`: the tests every adapter passes, inherited by one short test file.

    from accel.testing import AdapterConformanceSuite

    class TestMyDeviceConformance(AdapterConformanceSuite):
        adapter = "mydevice"    # on its hardware when available here, else emulated on the CPU

The suite launches one multi-process run of every check that applies (`accel launch`,
2 ranks when the adapter claims several processes per host, gloo when emulated), then
each test compares what the ranks returned with a reference computed here, in plain
PyTorch without accel. What the adapter's `Capabilities` leave out is skipped with the
reason; what they claim is tested, and fails if it does not work.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
import safetensors.torch
import torch
from torch.testing import assert_close

from ..adapter.base import Adapter, Capabilities
from ..adapter.registry import availability, effective_api_version, get_adapter_class
from . import problems
from .catalogue import CASES, ErrorCase, matches
from .checks import CLIP_NORM, CONVERGE_STEPS, FP16_INIT_SCALE, TRAIN_STEPS
from .worker import ABORTED

F = TypeVar("F", bound=Callable[..., Any])
STRATEGIES = ("ddp", "fsdp2")
PARALLEL_CHECKS = ("tp", "hsdp")
"""The N-D parallelism (`Capabilities.parallelism`) the kit trains; "cp" needs a GPU and has no kit check yet."""
HALF = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
# Equivalence checks run on the adapter's device and are compared with a CPU reference:
# tight, but not bitwise (a GPU's fp32 matmul sums in another order).
RTOL, ATOL = 1e-4, 1e-5


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert_close(actual, expected, rtol=RTOL, atol=ATOL)


def kit_checks(check: str, *members: str) -> Callable[[F], F]:
    """Declare what a suite test holds the adapter to: the worker check it reads (`check`) and the
    `Adapter` members whose behaviour it judges. The contract reference's "Kit check" column is built
    from these declarations (`accel.testing.contract_doc`), so a new test documents itself."""

    def mark(function: F) -> F:
        function.__accel_kit_checks__ = (check, members)  # type: ignore[attr-defined]
        return function

    return mark


def declared_kit_checks() -> dict[str, list[str]]:
    """`Adapter` member -> the suite tests (and suite methods) that judge it, from `kit_checks`."""
    found: dict[str, list[str]] = {}
    for name, value in vars(AdapterConformanceSuite).items():
        function = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        declared = getattr(function, "__accel_kit_checks__", None)
        if declared:
            for member in declared[1]:
                found.setdefault(member, []).append(name)
    return found


@dataclass
class KitRun:
    """What one multi-process run of the checks returned, rank by rank."""

    world: int
    capabilities: Capabilities
    out: Path
    results: list[dict[str, Any]]
    launch_output: str

    def get(self, name: str) -> list[dict[str, Any]]:
        """Every rank's result for check `name`; fails the test with the workers' traceback if one raised."""
        aborted = [(res[ABORTED].get("rank", r), res[ABORTED]) for r, res in enumerate(self.results) if ABORTED in res]
        if aborted:
            pytest.fail(
                "the conformance run stopped: "
                + "\n".join(
                    f"rank {r} failed before the process group formed, in check {a['check']!r}:\n{a['error']}"
                    for r, a in aborted
                )
            )
        if len(self.results) != self.world:
            pytest.fail(f"the conformance run did not finish on every rank:\n{self.launch_output}")
        errors = [f"rank {r}:\n{res[name]['error']}" for r, res in enumerate(self.results) if "error" in res[name]]
        if errors:
            pytest.fail(f"check {name!r} raised:\n" + "\n".join(errors))
        return [res[name]["ok"] for res in self.results]


class KitWarning(UserWarning):
    """Something the kit could not check, and what the adapter (or its stand-in) adds so that it can."""


RANK_GRACE = 60.0
"""Seconds the other ranks may run on once one rank has finished (or died): then the run is ended."""


def run_kit_launch(
    cmd: list[str],
    env: dict[str, str],
    out: Path,
    world: int,
    caps: Capabilities,
    *,
    timeout: float,
    grace: float = RANK_GRACE,
) -> KitRun:
    """Run the kit's launch `cmd` and read every rank's `rank<r>.json` from `out`. It never hangs: once one
    rank has written its results (or the launcher has exited), the others get `grace` seconds, then
    the whole launch (its process group) is ended and the output so far is what the tests show."""
    files = [out / f"rank{r}.json" for r in range(world)]
    with tempfile.TemporaryFile("w+") as stdout, tempfile.TemporaryFile("w+") as stderr:
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, env=env, start_new_session=True)
        start, first_done, ended = time.monotonic(), None, ""
        while proc.poll() is None:
            now = time.monotonic()
            if first_done is None and any(f.is_file() for f in files):
                first_done = now
            if now - start > timeout or (first_done is not None and now - first_done > grace):
                done = [r for r, f in enumerate(files) if f.is_file()]
                ended = (
                    f"\nthe kit ended the run: ranks {done} finished, the others were still running "
                    f"{grace:.0f} s later (a rank waiting for one that has exited)"
                    if first_done is not None
                    else f"\nthe kit ended the run after its timeout of {timeout:.0f} s"
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.2)
        stdout.seek(0)
        stderr.seek(0)
        output = f"exit {proc.returncode}{ended}\nSTDOUT:\n{stdout.read()[-4000:]}\nSTDERR:\n{stderr.read()[-8000:]}"
    results = [json.loads(f.read_text()) for f in files if f.is_file()]
    return KitRun(world=world, capabilities=caps, out=out, results=results, launch_output=output)


class AdapterConformanceSuite:
    """Inherit it, set `adapter` (and `emulate`), and pytest runs the whole kit on that adapter."""

    adapter: ClassVar[str] = ""
    """Name of the adapter under test (its entry point in `accel.adapter`)."""
    emulate: ClassVar[bool | None] = None
    """True: run the adapter's code on the CPU with gloo (`accel launch --emulate`); False: on
    its hardware; None (default): on the hardware when the adapter is available here, else
    emulated. With ACCEL_KIT_REQUIRE_HARDWARE=1 (hardware CI) emulation is an error instead."""
    launch_args: ClassVar[tuple[str, ...]] = ()
    """Extra `accel launch` flags, e.g. an adapter's own options."""
    env: ClassVar[dict[str, str]] = {}
    """Extra environment for the workers."""
    processes: ClassVar[int | None] = None
    """How many processes the kit launches: by default 2 when the adapter claims several per
    host, else 1. A machine with one device sets 1 (some collective backends cannot put two ranks on one device)."""
    timeout: ClassVar[float] = 1200.0
    """Seconds the whole multi-process run may take."""
    collective_timeout: ClassVar[float] = 180.0
    """Seconds a collective may wait: a check that leaves one rank behind fails instead of hanging."""
    data_parallel_strategy: ClassVar[str] = "ddp"
    """The strategy the kit's `ddp` checks (training, clipping, resume, save_model) run with: an adapter
    whose data parallelism is a strategy of its own package names it here (a data-parallel strategy of the adapter's package)."""

    distributed_type: ClassVar[str | None] = None
    """The `DistributedType` name the adapter's data-parallel runs report, when Accelerate names this hardware
    otherwise than `MULTI_<DEVICE>` or `<DEVICE>` (DEVICE: `hardware_device_type` in capitals). None: one of those."""
    vendor_checks: ClassVar[bool | None] = None
    """Run the vendor checks (device made current, device RNG, vendor module used, fp16 scaler) under
    emulation. None (default): when the adapter's hardware device is not the CPU. True: also for a
    device that computes in host memory but keeps device state of its own in its vendor library (a
    current device, its own generators). False: never (the tests skip, saying so)."""
    emulation_models: ClassVar[tuple[str, ...]] = ()
    """The adapter's own models for the emulation-decision check, as `package.module:function`
    names: each function returns a fresh `nn.Module`, or `(module, optimizer)` to check the
    optimizer decisions too. Each is prepared through the emulated adapter and its
    `hardware_twin`; their module trees and `decision_record`s must be equal."""
    extra_checks: ClassVar[tuple[str, ...]] = ()
    """The adapter's own distributed checks, as `package.module:function` names: each function
    takes the run's output folder, runs on every rank of the kit's launch (after the kit's own
    checks, in the same process group) and returns JSON; a test method reads every rank's
    result with `self.custom_results(kit, name)` and asserts on it."""

    # ---- the run ---------------------------------------------------------------------------
    @classmethod
    def adapter_class(cls) -> type[Adapter]:
        if not cls.adapter:
            raise TypeError(f"{cls.__name__} must set `adapter` to the name of the adapter under test.")
        return get_adapter_class(cls.adapter)

    @classmethod
    @kit_checks("emulation", "availability")
    def emulated(cls) -> bool:
        """Whether this run is emulated (see `emulate`)."""
        emulate = not availability(cls.adapter_class()) if cls.emulate is None else cls.emulate
        if emulate and os.environ.get("ACCEL_KIT_REQUIRE_HARDWARE") == "1":
            reason = availability(cls.adapter_class()).reason or f"{cls.__name__}.emulate is True"
            pytest.fail(
                f"ACCEL_KIT_REQUIRE_HARDWARE=1 but the {cls.adapter!r} adapter would run emulated: {reason}. "
                "Run on its hardware with its vendor stack installed, or unset ACCEL_KIT_REQUIRE_HARDWARE."
            )
        return emulate

    @classmethod
    def planned_checks(cls, caps: Capabilities) -> list[str]:
        """The checks that apply to an adapter with `caps`, in the order they run."""
        strategies = [cls._strategy_run(s) for s in STRATEGIES if cls._strategy_run(s) in caps.strategies]
        half = [p for p in ("bf16", "fp16", "fp8") if p in caps.precisions]
        names = ["process_state", "claims", "sharding", "collectives", "accumulation", "no_sync", "errors"]
        names += [
            f"{check}:{s}" for check in ("training", "clip_grad_norm", "resume", "save_model") for s in strategies
        ]
        names += [f"precision:{p}" for p in half]
        names.append(f"unwrap_model:{next((p for p in half if p in HALF), 'no')}")
        if caps.compile:
            names.append("compile")
        if cls._world(caps) > 1:
            names += [f"parallel:{kind}" for kind in PARALLEL_CHECKS if kind in caps.parallelism]
        names += [f"custom:{path}" for path in cls.extra_checks]
        if cls.emulated():
            names.append("emulation:" + ",".join(cls.emulation_models))
            if cls._vendor_checks_apply() is None:
                names.append("vendor")
        else:
            names.append("hardware")
        return names

    @pytest.fixture(scope="class")
    @classmethod
    def kit(cls, tmp_path_factory: pytest.TempPathFactory) -> KitRun:
        self = cls
        caps = self.adapter_class().capabilities
        world = cls._world(caps)
        out = tmp_path_factory.mktemp(f"kit-{self.adapter}")
        cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", str(world), "--adapter", self.adapter]
        cmd += ["--emulate"] if self.emulated() else []
        cmd += ["--timeout", str(self.collective_timeout), *self.launch_args]
        cmd += ["-m", "accel.testing.worker", str(out), *self.planned_checks(caps)]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCEL_")}
        env = {**clean, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", **self.env}
        return run_kit_launch(cmd, env, out, world, caps, timeout=self.timeout)

    @classmethod
    def _world(cls, caps: Capabilities) -> int:
        """How many processes the kit launches (`processes`)."""
        return cls.processes or (2 if caps.multi_process else 1)

    @classmethod
    def _vendor_checks_apply(cls) -> str | None:
        """None when the vendor checks run, else why not (`vendor_checks`)."""
        if cls.vendor_checks is False:
            return f"{cls.__name__}.vendor_checks is False"
        if cls.vendor_checks is None and cls.adapter_class().hardware_device_type == "cpu":
            return (
                "the adapter's hardware device is the CPU: no device to make current, no device generators "
                "(set vendor_checks = True when its vendor library keeps them anyway)"
            )
        return None

    @classmethod
    def _strategy_run(cls, strategy: str) -> str:
        """The strategy the kit's `strategy` checks run with (`data_parallel_strategy` for `ddp`)."""
        return cls.data_parallel_strategy if strategy == "ddp" else strategy

    @classmethod
    def _require_strategy(cls, kit: KitRun, strategy: str) -> str:
        """The strategy the checks ran with; skips the test when the adapter does not claim it."""
        name = cls._strategy_run(strategy)
        if name not in kit.capabilities.strategies:
            pytest.skip(f"the adapter does not claim the {name!r} strategy (Capabilities.strategies)")
        return name

    # ---- process state and data --------------------------------------------------------------
    @kit_checks(
        "process_state",
        "name",
        "hardware_device_type",
        "hardware_backend",
        "capabilities",
        "device_type",
        "backend",
        "device_for",
        "set_device",
        "data_parallel_type",
        "data_parallel_name",
    )
    def test_process_state(self, kit: KitRun) -> None:
        ranks = kit.get("process_state")
        assert sorted(r["process_index"] for r in ranks) == list(range(kit.world))
        assert [r["is_main_process"] for r in ranks] == [i == 0 for i in range(kit.world)]
        for r in ranks:
            assert r["num_processes"] == kit.world
            assert r["adapter"] == self.adapter and r["emulate"] == self.emulated()
            assert r["device_type"] == r["adapter_device_type"] == r["param_device_type"]
            assert r["use_distributed"] == (kit.world > 1)
            if kit.world > 1:
                assert r["backend"] == r["adapter_backend"], "the process group must use the adapter's backend"
                assert "NO" not in r["distributed_type"], "several processes must run distributed"
            if self.emulated():
                assert (r["device_type"], r["backend"] or "gloo") == ("cpu", "gloo")

    # ---- claims observable in one process (checks_claims) ----------------------------------------
    def _claims(self, kit: KitRun) -> list[dict[str, Any]]:
        return kit.get("claims")

    @kit_checks("claims", "data_parallel_name", "data_parallel_type", "hardware_device_type")
    def test_claim_distributed_type_names_the_device(self, kit: KitRun) -> None:
        cls = self.adapter_class()
        for r in self._claims(kit):
            d = r["distributed_type"]
            assert d["reported"] == d["declared"], (
                f"data_parallel_type reports DistributedType.{d['reported']}, but data_parallel_name declares "
                f"{d['declared']!r}"
            )
            device = d["hardware_device_type"].upper()
            expected = {self.distributed_type} if self.distributed_type else {f"MULTI_{device}", device}
            if (
                d["declared"] not in expected
                and effective_api_version(cls) < 2
                and "data_parallel_name" not in {n for k in cls.__mro__ if k is not Adapter for n in vars(k)}
            ):
                warnings.warn(
                    KitWarning(
                        f"the adapter (contract {effective_api_version(cls)}) declares no data_parallel_name, so its "
                        f"data-parallel runs report DistributedType.{d['declared']}: contract 2 added "
                        f"data_parallel_name; declare {' or '.join(sorted(expected))}"
                    ),
                    stacklevel=1,
                )
                continue
            assert d["declared"] in expected, (
                f"wrong DistributedType: data_parallel_name = {d['declared']!r} does not name the adapter's device "
                f"({cls.__name__}.hardware_device_type = {d['hardware_device_type']!r}): scripts comparing "
                f"accelerator.distributed_type with {' or '.join(sorted(expected))} would miss it. Declare "
                f"{' or '.join(sorted(expected))}, or set {type(self).__name__}.distributed_type to Accelerate's "
                "name for this hardware."
            )

    @kit_checks("claims", "empty_cache", "vendor_module")
    def test_claim_empty_cache_reaches_the_vendor_module(self, kit: KitRun) -> None:
        for r in self._claims(kit):
            e = r["empty_cache"]
            if e["module"] is None:
                if e["overridden"] and self.emulated():
                    pytest.fail(
                        "the adapter overrides empty_cache but declares no emulated vendor module: the kit cannot "
                        "see where it goes (declare emulated_vendor_module)"
                    )
                continue
            if e["overridden"] or e["vendor_has_empty_cache"]:
                assert e["calls"], (
                    f"empty_cache (free_memory) made no call into the adapter's vendor module {e['module']}: "
                    "the memory hook must release the adapter's own device memory through its vendor module "
                    "(not another device's)"
                )

    @kit_checks("claims", "place_model", "places_model")
    def test_claim_model_is_placed_on_the_device(self, kit: KitRun) -> None:
        for r in self._claims(kit):
            p = r["placement"]
            assert p["device_type"] in p["moves"], (
                f"model left on the host: prepare never moved the model onto the device ({p['device_type']}); "
                f"Module.to was asked for {p['moves'] or 'nothing'}. places_model/place_model must move it"
            )
            if not self.emulated():
                assert p["param_device_types"] == [self.adapter_class().hardware_device_type], (
                    f"parameters on {p['param_device_types']}, not the adapter's device"
                )

    @kit_checks("claims", "after_prepare", "prepare_optimizer", "optimizer_step")
    def test_claim_scheduler_steps_the_optimizer_that_trains(self, kit: KitRun) -> None:
        for r in self._claims(kit):
            o = r["optimizer"]
            assert o["same_optimizer"], (
                f"the scheduler steps another optimizer ({o['scheduled']}) than the one the optimizer wrapper steps "
                f"({o['stepping']}): a hook (after_prepare?) replaced the optimizer and left the scheduler on the "
                "old one"
            )
            wrong = [(step, s, used) for step, (s, used) in enumerate(o["lrs"]) if abs(s - used) > 1e-12]
            assert not wrong, (
                f"the scheduler's learning rate is not the one the optimizer steps with (step, reported, used): "
                f"{wrong[:3]}"
            )

    @kit_checks("claims", "prepare_optimizer", "after_prepare", "optimizer_step")
    def test_claim_optimizer_matches_adamw_with_weight_decay(self, kit: KitRun) -> None:
        for r in self._claims(kit):
            o = r["optimizer"]
            assert o["finite"] and o["max_abs_diff"] <= 1e-6, (
                f"the optimizer that steps ({o['stepping']}) does not train like torch.optim.AdamW with weight "
                f"decay and a scheduler: weights differ by {o['max_abs_diff']:.3g} (allowed 1e-6) — an optimizer "
                "the adapter substitutes must compute the same update (decoupled weight decay included)"
            )

    @kit_checks("claims", "autocast", "hardware_device_type", "hardware_backend", "device_type", "backend")
    def test_claim_autocast_device_and_backend_match_the_declaration(self, kit: KitRun) -> None:
        for r in self._claims(kit):
            a = r["autocast"]
            wrong = [d for d in a["emulated"] if d != a["device_type"]]
            assert not wrong, (
                f"autocast on the wrong device type: the adapter's autocast asked for {wrong}, the run's device type "
                f"is {a['device_type']!r}"
            )
            twin = a["twin"]
            if "error" in twin and "device_type" not in twin:
                continue  # the adapter cannot be built without emulation here: hardware mode checks it
            assert twin.get("device_type") == a["hardware_device_type"], (
                f"device_type off emulation is {twin.get('device_type')!r}, hardware_device_type declares "
                f"{a['hardware_device_type']!r}"
            )
            assert twin.get("backend") == a["hardware_backend"], (
                f"wrong collective backend: off emulation the adapter's backend is {twin.get('backend')!r}, "
                f"hardware_backend declares {a['hardware_backend']!r}"
            )
            off = [d for d in twin["autocast"] if d != a["hardware_device_type"]]
            assert not off, (
                f"autocast on the wrong device type: off emulation the adapter's autocast asks for {off}, "
                f"hardware_device_type declares {a['hardware_device_type']!r}"
            )

    @kit_checks("claims", "vendor_module", "emulated_vendor_module")
    def test_claim_stand_in_has_the_real_vendor_functions(self, kit: KitRun) -> None:
        n = self._claims(kit)[0]["names"]
        if n["stand_in"] is None:
            pytest.skip("the adapter declares no separate stand-in for its vendor module")
        if n["real"] is None:
            warnings.warn(
                KitWarning(
                    f"{n['real_module'] or self.adapter_class().vendor_module} cannot be imported here "
                    f"({n.get('import_error')}) and {n['module']} declares no REAL_FUNCTIONS: the kit cannot compare "
                    "the stand-in's function names with the real module's"
                ),
                stacklevel=1,
            )
            return
        extra = sorted(set(n["stand_in"]) - set(n["real"]))
        assert not extra, (
            f"stand-in names differ from the real vendor module: {n['module']} has {extra}, which "
            f"{n['source']} lacks — on hardware the adapter's calls (and the base's empty_cache, manual_seed, "
            "get_rng_state, set_rng_state, which look the names up) find nothing. Name the stand-in's functions "
            "as the real module does"
        )

    @kit_checks("hardware", "hardware_device_type", "hardware_backend", "autocast", "get_device_rng_state")
    def test_hardware_placement_backend_autocast_and_rng(self, kit: KitRun) -> None:
        """Hardware mode only (`ACCEL_KIT_REQUIRE_HARDWARE=1`): what emulation cannot observe."""
        if self.emulated():
            pytest.skip("hardware mode only: runs off emulation (ACCEL_KIT_REQUIRE_HARDWARE=1 on the hardware)")
        cls = self.adapter_class()
        for r in kit.get("hardware"):
            assert r["param_device_types"] == [cls.hardware_device_type], (
                f"parameters on {r['param_device_types']} after prepare, not on {cls.hardware_device_type!r}"
            )
            if kit.world > 1:
                assert r["backend"] == cls.hardware_backend, (
                    f"the process group runs {r['backend']!r}, hardware_backend declares {cls.hardware_backend!r}"
                )
            for mode, dtype in r["autocast"].items():
                assert dtype == HALF[mode], f"under autocast({mode}) a matmul on the device computed in {dtype}"
            rng = r["rng"]
            if rng is not None:
                assert rng["restored_equal"], "the vendor's device RNG state did not round-trip (get/set_rng_state)"
                assert rng["seed_changes_draws"], "manual_seed did not change the device's random draws"

    @kit_checks("sharding", "prepare_data_loader_kwargs")
    def test_sharding_and_gather_for_metrics_are_exact(self, kit: KitRun) -> None:
        ranks = kit.get("sharding")
        n = ranks[0]["n"]
        assert len({len(r["batches"]) for r in ranks}) == 1, "every rank must get the same number of batches"
        seen = {v for r in ranks for batch in r["batches"] for v in batch}
        assert seen == set(range(n)), "every sample must reach some rank"
        for r in ranks:
            assert r["gathered"] == list(range(n)), "gather_for_metrics must drop exactly the padding"
            assert r["objects"] == [f"sample-{i}" for i in range(n)]
            first, second = r["shuffled_epochs"]
            assert sorted(first) == sorted(second) == list(range(n))
            assert first != second, "shuffling must change the order every epoch"
            assert r["shuffled_epochs"] == ranks[0]["shuffled_epochs"], "every rank must see the same order"

    # ---- training ------------------------------------------------------------------------------
    @pytest.mark.parametrize("strategy", STRATEGIES)
    @kit_checks(
        "training",
        "before_prepare",
        "after_prepare",
        "places_model",
        "place_model",
        "optimize_model",
        "check_strategy",
        "ddp_device_ids",
        "prepare_optimizer",
        "strategy_defaults",
        "default_strategy",
        "strategy_aliases",
        "after_backward",
        "optimizer_step",
        "after_optimizer_step",
    )
    def test_training_equals_single_process(self, kit: KitRun, strategy: str) -> None:
        ranks = kit.get(f"training:{self._require_strategy(kit, strategy)}")
        reference = problems.reference_sgd(TRAIN_STEPS, kit.world)
        for r in ranks:
            _close(problems.as_tensor(r["params"]), reference)
            assert r["params"] == ranks[0]["params"], "replicas must hold identical weights"

    @kit_checks("accumulation", "after_backward", "optimizer_step")
    def test_gradient_accumulation_equals_big_batch(self, kit: KitRun) -> None:
        ranks = kit.get("accumulation")
        reference = problems.reference_sgd(TRAIN_STEPS, kit.world)
        for r in ranks:
            assert r["sync_gradients"] == [False, True] * TRAIN_STEPS
            _close(problems.as_tensor(r["params"]), reference)

    @kit_checks("no_sync", "default_strategy", "strategy_aliases")
    def test_no_sync_keeps_local_gradients(self, kit: KitRun) -> None:
        ranks = kit.get("no_sync")
        local, synced = problems.local_grads(kit.world), problems.global_grad(kit.world)
        for rank, r in enumerate(ranks):
            _close(problems.as_tensor(r["local"]), local[rank])
            _close(problems.as_tensor(r["synced"]), synced)
        if kit.world > 1:
            assert ranks[0]["local"] != ranks[1]["local"], "inside no_sync gradients must not be averaged"

    @pytest.mark.parametrize("strategy", STRATEGIES)
    @kit_checks("clip_grad_norm", "clip_grad_norm_")
    def test_clip_grad_norm_matches_direct_computation(self, kit: KitRun, strategy: str) -> None:
        name = self._require_strategy(kit, strategy)
        grad = problems.global_grad(kit.world)
        norm = grad.norm()
        expected = grad * min(1.0, CLIP_NORM / (float(norm) + 1e-6))
        for r in kit.get(f"clip_grad_norm:{name}"):
            _close(torch.tensor(r["norm"]), norm)
            _close(problems.as_tensor(r["clipped"]), expected)

    # ---- collectives -----------------------------------------------------------------------------
    @kit_checks("collectives", "barrier")
    def test_collectives(self, kit: KitRun) -> None:
        w = kit.world
        values = [[k * 10 + 1.0, k * 10 + 2.0] for k in range(w)]
        flat = [v for pair in values for v in pair]
        widest = w  # rank k holds k + 1 rows; every rank is padded to the widest

        def padded(k: int, first: bool) -> list[list[float]]:
            rows = [[100.0 * k + 2 * i, 100.0 * k + 2 * i + 1] for i in range(k + 1)]
            pad = [[-1.0, -1.0]] * (widest - k - 1)
            return pad + rows if first else rows + pad

        sizes = _split_sizes(5, w)
        chunks = [list(range(sum(sizes[:k]), sum(sizes[: k + 1]))) for k in range(w)]
        for k, r in enumerate(kit.get("collectives")):
            assert r["gather"] == flat and r["gather_device_type"] == kit.get("process_state")[k]["device_type"]
            assert r["nested_a"] == flat and r["nested_b0"] == [2 * v for v in flat]
            assert r["nested_b1"] == [int(v) for v in flat] and r["nested_b1_dtype"] == "torch.int64"
            assert r["reduce_sum"] == [sum(v[i] for v in values) for i in range(2)]
            _close(torch.tensor(r["reduce_mean"]), torch.tensor(values).mean(0))
            assert r["broadcast_0"] == values[0] and r["broadcast_last"] == values[-1]
            assert r["padded"] == padded(k, False) and r["padded_first"] == padded(k, True)
            assert r["gather_padded"] == [row for j in range(w) for row in padded(j, False)]
            assert r["gather_object"] == [{"rank": j} for j in range(w)]
            assert r["split"] == chunks[k]
            # Padded with the input's last item (4), as Accelerate pads.
            assert r["split_padded"] == (chunks[k] + [4] * (len(chunks[0]) - len(chunks[k])))

    # ---- mixed precision ----------------------------------------------------------------------------
    @pytest.mark.parametrize("mode", ["bf16", "fp16", "fp8"])
    @kit_checks(
        "precision",
        "supports_precision",
        "precision_class",
        "autocast",
        "make_grad_scaler",
        "has_own_optimizer_step",
    )
    def test_mixed_precision(self, kit: KitRun, mode: str) -> None:
        if mode not in kit.capabilities.precisions:
            pytest.skip(f"the adapter does not claim mixed_precision={mode!r} (Capabilities.precisions)")
        dims = problems.FP8_DIMS if mode == "fp8" else (problems.IN, problems.HIDDEN, problems.OUT)
        x, _ = problems.make_data(CONVERGE_STEPS * problems.PER_RANK * kit.world, dims=dims)
        with torch.no_grad():
            fp32_out = problems.build_model(dims=dims)(x[: problems.PER_RANK])
        tolerance = 0.25 if mode == "fp8" else 5e-2
        for r in kit.get(f"precision:{mode}"):
            assert r["output_dtype"] == "torch.float32", "outputs must come back in fp32"
            assert r["state_dict_dtypes"] == ["torch.float32"], "the saved (master) weights must be fp32"
            if mode in HALF:
                assert r["inner_dtypes"] == [HALF[mode]], f"layers must compute in {HALF[mode]} under autocast"
            assert_close(torch.tensor(r["output"]), fp32_out, rtol=tolerance, atol=tolerance)
            losses = r["losses"]
            assert all(torch.isfinite(torch.tensor(losses))), f"non-finite loss under {mode}: {losses}"
            # fp8 trains a wider problem that SGD fits more slowly in the same number of steps
            # (the fp32 reference reaches 0.76 of the initial loss, the small problem 0.02).
            ratio = r["eval_after"] / r["eval_before"]
            assert ratio < (0.9 if mode == "fp8" else 0.5), f"training under {mode} did not converge: {ratio=:.3f}"
            if mode == "fp16":
                self._check_loss_scaling(r, kit.world)

    @staticmethod
    def _check_loss_scaling(r: dict[str, Any], world: int) -> None:
        assert r["initial_scale"] == FP16_INIT_SCALE, "GradScalerKwargs(init_scale=...) must reach the scaler"
        assert_close(torch.tensor(r["scaled_over_unscaled"]), torch.tensor(r["initial_scale"]), rtol=1e-3, atol=0)
        assert_close(problems.as_tensor(r["unscaled_grads"]), problems.global_grad(world), rtol=5e-2, atol=5e-3)
        assert r["inf_step_skipped"] and r["inf_params_unchanged"], "an inf gradient must skip the step"
        assert r["inf_scale_after"] == r["scale_before_inf"] / 2, "an inf gradient must halve the loss scale"
        assert r["lr_after"] == r["lr_before"], "a skipped step must not step the scheduler"

    # ---- checkpoints and models ------------------------------------------------------------------------
    @pytest.mark.parametrize("strategy", STRATEGIES)
    @kit_checks(
        "resume",
        "get_rng_state",
        "set_rng_state",
        "get_device_rng_state",
        "set_device_rng_state",
        "checkpoint_on_host",
        "barrier",
    )
    def test_save_state_load_state_resume_exactly(self, kit: KitRun, strategy: str) -> None:
        for r in kit.get(f"resume:{self._require_strategy(kit, strategy)}"):
            assert r["losses_resumed"] == r["losses_uninterrupted"]
            assert r["bitwise_equal"], f"resumed weights differ by up to {r['max_abs_diff']}"

    @pytest.mark.parametrize("strategy", STRATEGIES)
    @kit_checks("save_model", "checkpoint_on_host")
    def test_save_model_loads_into_a_plain_module(self, kit: KitRun, strategy: str) -> None:
        ranks = kit.get(f"save_model:{self._require_strategy(kit, strategy)}")
        directory = Path(ranks[0]["directory"])
        for folder in (directory, directory.with_name(directory.name + "-sharded")):
            plain = problems.build_model(seed=123)
            index = folder / "model.safetensors.index.json"
            files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else []
            state: dict[str, torch.Tensor] = {}
            for name in files or ["model.safetensors"]:
                state.update(safetensors.torch.load_file(str(folder / name)))
            plain.load_state_dict(state, strict=True)
            assert torch.equal(problems.flat_params(plain), problems.as_tensor(ranks[0]["params"]))
        assert len(list((directory.with_name(directory.name + "-sharded")).glob("*.safetensors"))) > 1

    @kit_checks("unwrap_model", "places_model", "optimize_model")
    def test_unwrap_model_returns_the_original(self, kit: KitRun) -> None:
        name = next(n for n in self.planned_checks(kit.capabilities) if n.startswith("unwrap_model"))
        for r in kit.get(name):
            assert r["is_original"], f"unwrap_model returned something else than the model (prepared: {r})"
            if not name.endswith(":no"):
                assert r["forward_restored"], "keep_fp32_wrapper=False must restore the original forward"

    @kit_checks("compile", "compile_backends", "dynamo_settings", "compile_backend")
    def test_compile(self, kit: KitRun) -> None:
        if not kit.capabilities.compile:
            pytest.skip("the adapter does not claim torch.compile (Capabilities.compile)")
        reference = problems.reference_sgd(TRAIN_STEPS, kit.world)
        for r in kit.get("compile"):
            assert r["compiled"], "prepare with a dynamo backend must return a compiled model"
            assert r["unwrapped_is_original"]
            _close(problems.as_tensor(r["params"]), reference)

    # ---- N-D parallelism the adapter claims ----------------------------------------------------------
    @kit_checks("parallel", "capabilities", "place_model")
    @pytest.mark.parametrize("kind", PARALLEL_CHECKS)
    def test_parallelism_trains_like_one_process(self, kit: KitRun, kind: str) -> None:
        """TP over every process, or HSDP (2 x world/2 from 4 processes, else the 1 x world mesh), trains the
        kit's MLP to the losses (1e-5) and weights of one process on the same global batches."""
        if kind not in kit.capabilities.parallelism:
            pytest.skip(f"the adapter does not claim {kind!r} (Capabilities.parallelism)")
        if kit.world == 1:
            pytest.skip(f"{kind!r} needs several processes; the kit runs one (the adapter runs one per host)")
        ranks = kit.get(f"parallel:{kind}")
        n_dp = 1 if kind == "tp" else kit.world
        losses, params = _reference_losses(TRAIN_STEPS, n_dp)
        replicate = 2 if kind == "hsdp" and kit.world >= 4 and kit.world % 2 == 0 else 1
        expected_mesh = (
            {"tp": kit.world}
            if kind == "tp"
            else {"dp_replicate": replicate, "dp_shard": kit.world // replicate}
            if replicate > 1
            else {"dp_shard": kit.world}
        )
        device_type = kit.get("process_state")[0]["device_type"]
        for r in ranks:
            assert r["mesh"] == expected_mesh and r["mesh_device_type"] == device_type, (r["mesh"], expected_mesh)
            assert r["data_shards"] == n_dp, "loaders must shard over the data-parallel dimensions only"
            assert r["dtensor_params"] == 4, "every weight and bias must be a DTensor (sharded or split)"
            assert_close(torch.tensor(r["losses"]), losses, rtol=0, atol=1e-5)
            _close(problems.as_tensor(r["params"]), params)

    def test_context_parallelism(self, kit: KitRun) -> None:
        """Context parallelism is claimed only with a GPU behind it; the kit has no CPU stand-in for it."""
        if "cp" not in kit.capabilities.parallelism:
            pytest.skip("the adapter does not claim 'cp' (Capabilities.parallelism)")
        if self.emulated() or kit.get("process_state")[0]["device_type"] == "cpu":
            pytest.skip(
                "context parallelism needs the adapter's GPU (torch's context_parallel has no gloo/CPU path): "
                "it runs only on hardware"
            )
        pytest.skip("the kit has no context-parallel check yet: run docs/parallelism.md's CP example on 2+ GPUs")

    # ---- errors and emulation ----------------------------------------------------------------------------
    @pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
    @kit_checks("errors", "supports_precision", "capabilities")
    def test_error_catalogue(self, kit: KitRun, case: ErrorCase) -> None:
        caps = kit.capabilities
        if case.needs == "distributed" and kit.world == 1:
            pytest.skip("only raised with several processes; the adapter runs one per host")
        if case.needs == "fsdp2" and "fsdp2" not in caps.strategies:
            pytest.skip("the adapter does not claim the 'fsdp2' strategy")
        if case.needs == "unclaimed-precision" and set(caps.precisions) >= {"no", "bf16", "fp16", "fp8"}:
            pytest.skip("the adapter claims every precision")
        for rank, r in enumerate(kit.get("errors")):
            report = r[case.name]
            assert matches(case, report), (
                f"rank {rank}: expected {case.error.__name__} matching {case.match!r}, "
                f"got {report['type'] or 'no error'}: {report['message']}"
            )

    @kit_checks("emulation", "optimize_model", "prepare_optimizer", "decision_record")
    def test_emulation_makes_the_hardware_decisions(self, kit: KitRun) -> None:
        if not self.emulated():
            pytest.skip("runs only under emulation (it compares the emulated run with the hardware decisions)")
        for r in kit.get("emulation:" + ",".join(self.emulation_models)):
            assert r["emulate"]
            for m in r["models"]:
                emulated, hardware = m["emulated"], m["hardware"]
                assert emulated["tree"] == hardware["tree"], (
                    f"{m['model']}: emulation changed a wrapping decision: {emulated['tree']} vs {hardware['tree']}"
                )
                assert emulated["record"] == hardware["record"], (
                    f"{m['model']}: emulation changed a decision (dtypes, memory formats, optimizer flags): "
                    f"{emulated['record']} vs on hardware {hardware['record']}"
                )

    def custom_results(self, kit: KitRun, path: str) -> list[Any]:
        """Every rank's result of the adapter's own check `path` (one of `extra_checks`)."""
        if path not in self.extra_checks:
            raise ValueError(f"{path!r} is not in {type(self).__name__}.extra_checks {self.extra_checks}")
        return kit.get(f"custom:{path}")

    # ---- the adapter's vendor code, under emulation ----------------------------------------------------------
    def _vendor(self, kit: KitRun) -> list[dict[str, Any]]:
        """Every rank's `vendor` report; skips where the vendor checks do not apply."""
        if not self.emulated():
            pytest.skip("runs only under emulation (it instruments the adapter's emulated vendor module)")
        why_not = self._vendor_checks_apply()
        if why_not:
            pytest.skip(why_not)
        ranks = kit.get("vendor")
        for r in ranks:
            if not r["instrumented"]:
                pytest.fail(
                    f"the {self.adapter!r} adapter declares no emulated vendor module (Adapter.emulated_vendor_module), "
                    "so nothing stands for its device calls: no set_device, no device RNG, no vendor code to check. "
                    "Put the vendor calls in one module (vendor_module) with a CPU stand-in (emulated_vendor_module; "
                    "accel.testing.emulated has the pieces)."
                )
        return ranks

    @kit_checks("vendor", "set_device", "before_process_group", "emulated_vendor_module")
    def test_vendor_device_made_current_before_process_group(self, kit: KitRun) -> None:
        for r in self._vendor(kit):
            rank, module, calls = r["local_rank"], r["emulated_vendor_module"], r["before_process_group"]
            setters = r["device_setters"]
            if setters:
                made = [c for c in calls if c["name"] in setters]
                names = " or ".join(f"{module}.{s}" for s in setters)
                assert made, (
                    f"rank {rank}: {names} was never called before the process group started: the adapter's "
                    f"set_device hook must make device {rank} (the local rank's) current through its vendor module "
                    f"(e.g. self.vendor.set_device({rank})), before init_process_group. Calls into {module} before "
                    f"the process group: {[c['name'] for c in calls] or 'none'}"
                )
                indices = _indices(made)
                if "set_device" in {c["name"] for c in made}:
                    assert indices, (
                        f"rank {rank}: {module}.set_device was called without a device index ({made}): "
                        f"pass the local rank's device ({rank})"
                    )
            else:
                made = [c for c in calls if c["hook"] is not None]
                assert made, (
                    f"rank {rank}: the adapter's set_device and before_process_group hooks made no call into "
                    f"{module} before the process group started, and {module} declares no current-device setter "
                    "(no set_device, CURRENT_DEVICE_SETTERS empty): set_device (or before_process_group) must make "
                    f"the device current (and register the backend) through the vendor module. Calls into {module} "
                    f"before the process group: {[c['name'] for c in calls] or 'none'}"
                )
                indices = _indices(made)
            if indices:
                assert rank in indices, (
                    f"rank {rank}: the device was made current with index {indices}, not the local rank "
                    f"(calls before the process group: {made})"
                )

    @kit_checks("vendor", "manual_seed", "get_device_rng_state", "set_device_rng_state")
    def test_vendor_device_rng_is_seeded_consumed_and_restored(self, kit: KitRun) -> None:
        for r in self._vendor(kit):
            module = r["emulated_vendor_module"]
            rng = r["rng"]
            if not r["has_generator"]:
                # Optional (added after contract 2 without a version bump): the kit checks the calls only.
                warnings.warn(
                    KitWarning(
                        f"{module} has no `generator(index)`: the kit cannot draw from the emulated device's "
                        "random generator, so it checks only that set_seed, save_state and load_state call "
                        f"{module}. Add one (accel.testing.emulated.DeviceGenerators provides one per device)."
                    ),
                    stacklevel=1,
                )
                calls = {k: rng[k] for k in ("set_seed_calls", "save_state_calls", "load_state_calls")}
                assert all(calls.values()), (
                    f"the adapter's device RNG hooks do not reach {module}: calls made from set_seed, save_state "
                    f"and load_state: {calls}"
                )
                continue
            assert rng["seeded_equal"] and rng["seed_changes_draws"], (
                "set_seed does not seed the device generators: the adapter's manual_seed never reaches "
                f"{module}.manual_seed (set_seed called {rng['set_seed_calls'] or 'nothing'} there)"
            )
            assert rng["consumed_by_training"], "the kit's training (dropout on the device generator) drew nothing"
            assert rng["resumed_equal"], (
                "load_state did not restore the device generators exactly: the adapter's get_device_rng_state/"
                f"set_device_rng_state must save and restore {module}'s state (save_state called "
                f"{rng['save_state_calls'] or 'nothing'} there, load_state {rng['load_state_calls'] or 'nothing'}); "
                f"losses after resuming {rng['losses_resumed']} vs uninterrupted {rng['losses_uninterrupted']}"
            )

    @kit_checks(
        "vendor",
        "vendor",
        "vendor_module",
        "emulated_vendor_module",
        "manual_seed",
        "get_device_rng_state",
        "set_device_rng_state",
    )
    def test_vendor_module_is_used_by_the_hooks(self, kit: KitRun) -> None:
        for r in self._vendor(kit):
            module = r["emulated_vendor_module"]
            missing = []
            if not r["all_calls"]:
                missing.append(f"the adapter never called {module}")
            rng = r.get("rng") or {}
            for hook, key in (
                ("manual_seed (set_seed)", "set_seed_calls"),
                ("get_device_rng_state (save_state)", "save_state_calls"),
                ("set_device_rng_state (load_state)", "load_state_calls"),
            ):
                if rng and not rng[key]:
                    missing.append(f"{hook} made no call into {module}")
            assert not missing, "the vendor module is not used by the adapter's hooks: " + "; ".join(missing)

    @kit_checks("vendor", "make_grad_scaler")
    def test_vendor_grad_scaler_is_used_under_fp16(self, kit: KitRun) -> None:
        if "fp16" not in kit.capabilities.precisions:
            pytest.skip("the adapter does not claim mixed_precision='fp16' (Capabilities.precisions)")
        for r in self._vendor(kit):
            scaler = r["scaler"]
            assert scaler["used"] is not None, "mixed_precision='fp16' prepared no grad scaler"
            if scaler["vendor"] is not None:
                assert scaler["used_is_vendor"], (
                    f"{r['emulated_vendor_module']}.GradScaler exists but fp16 used {scaler['used']}: "
                    "the adapter's make_grad_scaler must build the vendor's scaler"
                )
            assert scaler["used"] == scaler["adapter"], (
                f"fp16 used {scaler['used']}, not the adapter's make_grad_scaler ({scaler['adapter']})"
            )


def _reference_losses(steps: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One process, plain SGD on the global batch of every step: the losses and final weights."""
    model = problems.build_model()
    opt = torch.optim.SGD(model.parameters(), lr=problems.LR)
    x, y = problems.make_data(steps * problems.PER_RANK * world)
    losses = []
    for step in range(steps):
        batch = slice(step * problems.PER_RANK * world, (step + 1) * problems.PER_RANK * world)
        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return torch.tensor(losses), problems.flat_params(model)


def _indices(calls: list[dict[str, Any]]) -> list[int]:
    """The device indices the recorded calls passed (ints, or devices with an index)."""
    return [
        a if isinstance(a, int) else a["index"]
        for c in calls
        for a in c["args"]
        if (isinstance(a, int) and not isinstance(a, bool)) or (isinstance(a, dict) and a.get("index") is not None)
    ]


def _split_sizes(n: int, world: int) -> list[int]:
    """How `split_between_processes` divides `n` items: the first `n % world` ranks get one more."""
    return [n // world + (1 if k < n % world else 0) for k in range(world)]
