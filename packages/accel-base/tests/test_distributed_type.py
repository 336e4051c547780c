"""`DistributedType` and `is_<hardware>_available`: Accelerate's names, with no hardware named in the core.

Adapters contribute the names that mention hardware: the adapter in use says what its
data-parallel runs report, every other hardware name compares unequal (never
AttributeError), and `accel.utils.is_<x>_available` asks the installed adapters.
"""

from __future__ import annotations

import enum
import pickle
import re
from pathlib import Path

import accel.utils
import pytest
from accel import Accelerator, DistributedType
from accel.adapter.cpu import CPUAdapter
from conftest import launch


class Reference(str, enum.Enum):
    """How a member of Accelerate's `str, Enum` DistributedType behaves."""

    MULTI_GPU = "MULTI_GPU"


def test_members_behave_like_accelerates_enum_members() -> None:
    member, ref = DistributedType.MULTI_GPU, Reference.MULTI_GPU
    assert member == "MULTI_GPU" and member.name == ref.name and member.value == ref.value
    assert repr(member) == repr(ref).replace("Reference", "DistributedType")
    assert str(member) == str(ref).replace("Reference", "DistributedType")
    assert f"{member}" == f"{ref}".replace("Reference", "DistributedType")
    assert DistributedType("MULTI_GPU") is member and DistributedType["MULTI_GPU"] is member
    assert pickle.loads(pickle.dumps(member)) is member
    assert {member: 1}[DistributedType.MULTI_GPU] == 1
    core = ["NO", "MULTI_CPU", "DEEPSPEED", "FSDP", "MEGATRON_LM"]
    assert [m.name for m in DistributedType][:5] == core


def test_hardware_names_compare_unequal_instead_of_failing() -> None:
    accelerator = Accelerator()
    for name in ("XLA", "MULTI_GPU", "MULTI_HPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU"):
        assert accelerator.distributed_type != getattr(DistributedType, name)
    assert accelerator.distributed_type == DistributedType.NO
    with pytest.raises(AttributeError):
        DistributedType.multi_gpu  # noqa: B018 - lower case is never a member
    with pytest.raises(ValueError, match="is not a valid DistributedType"):
        DistributedType("multi gpu")


def test_the_adapter_names_its_data_parallel_runs() -> None:
    assert CPUAdapter().data_parallel_type(True) == DistributedType.MULTI_CPU
    assert CPUAdapter().data_parallel_type(False) == DistributedType.NO

    class GPUish(CPUAdapter):
        data_parallel_name = "MULTI_GPU"

    assert GPUish().data_parallel_type(True) is DistributedType.MULTI_GPU


def test_the_core_names_no_hardware() -> None:
    src = Path(accel.__file__).parent
    vendor = re.compile(r"(?<![a-z])(cuda|nccl|hpu|gaudi|habana|xla|tpu|ipex|npu|xpu)(?![a-z])", re.IGNORECASE)
    offenders = [
        f"{path.relative_to(src)}:{i}"
        for path in src.rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if vendor.search(line)
    ]
    assert offenders == []


def test_hardware_probes_come_from_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    assert accel.utils.is_npu_available() is False
    assert accel.utils.is_hpu_available(init_hccl=True) is False or "accel_gaudi" in str(accel.utils.is_hpu_available)
    monkeypatch.setenv("ACCEL_TEST_FAKEDEV", "1")
    assert accel.utils.is_fakedev_available() is True  # provided by the installed test adapter
    monkeypatch.setenv("ACCEL_TEST_FAKEDEV", "0")
    assert accel.utils.is_fakedev_available() is False
    with pytest.raises(AttributeError):
        accel.utils.not_a_probe  # noqa: B018


WORKER = """
from accel import Accelerator, DistributedType
acc = Accelerator()
print(f"rank {acc.process_index}: {acc.distributed_type.name} {acc.distributed_type == DistributedType.XLA}", flush=True)
"""


@pytest.mark.parametrize(("launch_args", "env", "expected"), [((), {}, "MULTI_CPU"), (("--adapter", "fakedev", "--emulate"), {"ACCEL_TEST_FAKEDEV": "1"}, "MULTI_FAKEDEV")])  # fmt: skip
def test_two_processes_report_the_adapters_name(write_script, launch_args, env, expected) -> None:
    proc = launch(write_script(WORKER), launch_args=launch_args, env=env, timeout=120)
    for rank in (0, 1):
        assert f"rank {rank}: {expected} False" in proc.stdout, proc.stdout
