"""The accel conformance kit, run against the Gaudi adapter in emulation."""

from accel.testing import AdapterConformanceSuite


class TestGaudiConformance(AdapterConformanceSuite):
    adapter = "gaudi"
    emulate = True
