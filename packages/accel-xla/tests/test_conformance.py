"""The accel conformance kit against the xla adapter: its multi-process checks run the
adapter's code emulated on gloo (torch_xla's CPU device gives each process a world of one).
Its data-parallel checks run with `xla_ddp`, the adapter's own data parallelism.
"""

from accel.testing import AdapterConformanceSuite


class TestXLAConformance(AdapterConformanceSuite):
    adapter = "xla"
    emulate = True
    data_parallel_strategy = "xla_ddp"
