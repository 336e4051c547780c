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
