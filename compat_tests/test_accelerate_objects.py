"""Kwargs handlers and plugins built with the real Accelerate and passed to accel: converted with a warning, or refused.

Runs in one process (no launcher). The comparison is with what the same object built from
`accel.utils` gives, so a setting lost in the conversion shows.
"""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")


@pytest.fixture(autouse=True)
def _fresh_state():
    from accel.state import AcceleratorState, GradientState

    AcceleratorState._reset_state()
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state()
    GradientState._reset_state()


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
    from accel.accelerate_objects import AccelerateObjectError

    with pytest.raises(AccelerateObjectError, match=r"disable=True.*from accel.utils import TorchDynamoPlugin"):
        accel.Accelerator(dynamo_plugin=accelerate.utils.TorchDynamoPlugin(disable=True))
    with pytest.raises(AccelerateObjectError, match=r"MSAMPRecipeKwargs .*has no accel counterpart"):
        accel.Accelerator(kwargs_handlers=[accelerate.utils.MSAMPRecipeKwargs()])
