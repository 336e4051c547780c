from accel.testing import AdapterConformanceSuite


class TestExampleConformance(AdapterConformanceSuite):
    adapter = "example"
    vendor_checks = True  # its device lives on the host, but has generators and a current device of its own
    emulation_models = ("accel_example_adapter.kit:model_with_adamw",)
    extra_checks = ("accel_example_adapter.kit:fused_adamw_trains",)

    def test_fused_adamw_trains_the_same_on_every_rank(self, kit):
        for result in self.custom_results(kit, "accel_example_adapter.kit:fused_adamw_trains"):
            assert result == {"fused": True, "same_on_every_rank": True}
