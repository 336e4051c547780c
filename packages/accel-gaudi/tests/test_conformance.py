"""The accel conformance kit, run against the Gaudi adapter: on Gaudi when one is present,
emulated on the CPU (gloo) everywhere else."""

from accel.testing import AdapterConformanceSuite


class TestGaudiConformance(AdapterConformanceSuite):
    adapter = "gaudi"
    # As optimum-habana, bf16 autocasts only with force_autocast (the adapter's default autocast
    # policy, "native_amp"); the kit checks that bf16 layers compute in bf16, so it asks for it.
    launch_args = ("--force-autocast",)
    # The kit compiles, and torch.compile runs on Gaudi only in eager mode (lazy mode refuses it, as
    # optimum-habana does): the kit runs with Habana's eager mode. Lazy mode's step markers are tested in
    # test_adapter.py and test_distributed.py.
    env = {"PT_HPU_LAZY_MODE": "0"}


def test_stand_in_real_functions_list_the_vendor_modules_functions() -> None:
    """`REAL_FUNCTIONS` (what the kit compares the stand-in with where accel_gaudi.hpu cannot be imported) is exactly
    the public functions hpu.py defines, read from its source."""
    import ast
    from pathlib import Path

    import accel_gaudi.hpu_emulated as stand_in

    source = Path(stand_in.__file__).with_name("hpu.py").read_text()
    defined = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert sorted(stand_in.REAL_FUNCTIONS) == sorted(defined)
