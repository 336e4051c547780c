"""Kwargs handlers and plugins built with the real Accelerate and passed to accel: converted with a warning, or refused.

Runs in one process (no launcher). The comparison is with what the same object built from
`accel.utils` gives, so a setting lost in the conversion shows.
"""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("accelerate")

# accel.testing's pytest plugin: every test builds its Accelerator from a fresh state.
pytestmark = pytest.mark.usefixtures("fresh_state")


def test_a_ddp_handler_is_converted_with_its_settings() -> None:
    import accel
    import accelerate.utils

    real = accelerate.utils.DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=7)
    with pytest.warns(UserWarning, match=r"from accel.utils import DistributedDataParallelKwargs"):
        accelerator = accel.Accelerator(kwargs_handlers=[real])
    handler = accelerator.ddp_handler
    assert isinstance(handler, accel.DistributedDataParallelKwargs)
    assert (
        handler.to_kwargs()
        == accel.DistributedDataParallelKwargs(find_unused_parameters=True, bucket_cap_mb=7).to_kwargs()
    )


def test_configuration_objects_are_converted() -> None:
    import accel
    import accelerate.utils

    config = accelerate.utils.DataLoaderConfiguration(split_batches=True, even_batches=False)
    plugin = accelerate.utils.GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=False)
    with pytest.warns(UserWarning, match="converted accelerate.utils"):
        accelerator = accel.Accelerator(dataloader_config=config, gradient_accumulation_plugin=plugin)
    assert isinstance(accelerator.dataloader_config, accel.DataLoaderConfiguration)
    assert accelerator.split_batches is True and accelerator.even_batches is False
    assert accelerator.gradient_accumulation_steps == 3
    assert accelerator.gradient_state.sync_with_dataloader is False


def test_an_object_accel_cannot_take_over_is_refused_naming_the_accel_import() -> None:
    import accel
    import accelerate.utils
    from accel.compat.objects import AccelerateObjectError

    # Every field of Accelerate 1.15's plugins now has an accel counterpart: a later Accelerate
    # field is stood in for by a subclass (reported as Accelerate's) that adds one.
    @dataclasses.dataclass
    class TorchDynamoPlugin(accelerate.utils.TorchDynamoPlugin):
        field_from_a_later_accelerate: int = 0

    TorchDynamoPlugin.__module__ = accelerate.utils.TorchDynamoPlugin.__module__
    with pytest.raises(
        AccelerateObjectError, match=r"field_from_a_later_accelerate=3.*from accel.utils import TorchDynamoPlugin"
    ):
        accel.Accelerator(dynamo_plugin=TorchDynamoPlugin(field_from_a_later_accelerate=3))
    with pytest.raises(AccelerateObjectError, match=r"MSAMPRecipeKwargs .*has no accel counterpart"):
        accel.Accelerator(kwargs_handlers=[accelerate.utils.MSAMPRecipeKwargs()])


def test_a_tracker_built_on_accelerates_general_tracker_is_driven_by_accel(tmp_path) -> None:
    import accel
    import accelerate.tracking
    import accelerate.utils

    class Recorder(accelerate.tracking.GeneralTracker):
        name = "recorder"
        requires_logging_directory = False

        def __init__(self, run_name: str) -> None:
            super().__init__()
            self.run_name = run_name
            self.events: list = []

        @property
        def tracker(self):
            return self.events

        @accelerate.tracking.on_main_process
        def start(self) -> None:
            self.events.append(("start",))

        @accelerate.tracking.on_main_process
        def store_init_configuration(self, values: dict) -> None:
            self.events.append(("config", dict(values)))

        @accelerate.tracking.on_main_process
        def log(self, values: dict, step=None, **kwargs) -> None:
            self.events.append(("log", step, dict(values), kwargs))

        @accelerate.tracking.on_main_process
        def finish(self) -> None:
            self.events.append(("finish",))

    recorder = Recorder("mine")
    # Accelerate's own LoggerType names a tracker too.
    accelerator = accel.Accelerator(
        log_with=[recorder, accelerate.utils.LoggerType.TENSORBOARD], project_dir=str(tmp_path)
    )
    accelerator.init_trackers("proj", config={"lr": 0.5})
    accelerator.log({"loss": 2.0}, step=4, log_kwargs={"recorder": {"commit": True}})
    assert accelerator.get_tracker("recorder") is recorder
    assert accelerator.get_tracker("recorder", unwrap=True) is recorder.events
    accelerator.end_training()
    assert recorder.events == [
        ("start",),
        ("config", {"lr": 0.5}),
        ("log", 4, {"loss": 2.0}, {"commit": True}),
        ("finish",),
    ]
    assert len(list((tmp_path / "proj").glob("*/hparams.yml"))) == 1


def test_accelerates_tensorboard_tracker_instance_writes_under_accel(tmp_path) -> None:
    import accel
    import accelerate.tracking

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing import event_accumulator

    tracker = accelerate.tracking.TensorBoardTracker("run", str(tmp_path))
    accelerator = accel.Accelerator(log_with=[tracker])
    accelerator.init_trackers("ignored-for-instances")
    accelerator.log({"loss": 0.25}, step=1)
    accelerator.end_training()
    reader = event_accumulator.EventAccumulator(str(tmp_path / "run"))
    reader.Reload()
    assert [(e.step, e.value) for e in reader.Scalars("loss")] == [(1, 0.25)]


def test_an_accelerate_object_that_is_not_a_tracker_is_refused_by_name() -> None:
    import accel
    import accelerate.tracking
    import accelerate.utils
    from accel.compat.objects import AccelerateObjectError

    with pytest.raises(
        AccelerateObjectError, match=r"ProjectConfiguration \(from the real accelerate package\) is not a tracker"
    ):
        accel.Accelerator(log_with=[accelerate.utils.ProjectConfiguration()])
    with pytest.raises(AccelerateObjectError, match=r"WandBTracker is a tracker class; pass an instance"):
        accel.Accelerator(log_with=[accelerate.tracking.WandBTracker])
