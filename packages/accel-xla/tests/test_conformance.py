"""The accel conformance kit against the xla adapter: its multi-process checks run the
adapter's code emulated on gloo (torch_xla's CPU device gives each process a world of one).
Its data-parallel checks run with `xla_ddp`, the adapter's own data parallelism.
"""

from accel.testing import AdapterConformanceSuite


class TestXLAConformance(AdapterConformanceSuite):
    adapter = "xla"
    emulate = True
    data_parallel_strategy = "xla_ddp"


def test_stand_in_real_functions_list_the_vendor_modules_functions() -> None:
    """`REAL_FUNCTIONS` (what the kit compares the stand-in with where accel_xla.xla cannot be imported) is exactly
    the public functions xla.py defines, read from its source."""
    import ast
    from pathlib import Path

    import accel_xla.xla_emulated as stand_in

    source = Path(stand_in.__file__).with_name("xla.py").read_text()
    defined = {n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}
    assert sorted(stand_in.REAL_FUNCTIONS) == sorted(defined)
