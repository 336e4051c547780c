"""DeepSpeed: the strategy (`strategy`), its plugin and config (`config`), several plugins in one run
(`plugins`), Accelerate's optimizer mapping (`optim`) and the engine-checkpoint safety check (`checkpoint`).

`accel.strategies.deepspeed` keeps every name the single module of earlier releases had."""

from .strategy import *  # noqa: F403
from .strategy import (  # noqa: F401  (public names of the earlier single module, beyond its __all__)
    CHECKPOINT_TAG,
    DEVICE_PLACEMENT,
    MULTIPLE_MODELS,
    DeepSpeedStrategy,
    ZeRO3Awareness,
    import_deepspeed,
    map_pytorch_optim_to_deepspeed,
    register_zero3_awareness,
)
from .strategy import __all__ as __all__
