"""DeepSpeed: the strategy (`strategy`), its plugin and config (`config`), several plugins in one run
(`plugins`), Accelerate's optimizer mapping (`optim`) and the engine-checkpoint safety check (`checkpoint`)."""

from .strategy import *  # noqa: F403
from .strategy import DeepSpeedStrategy, map_pytorch_optim_to_deepspeed  # noqa: F401
from .strategy import __all__ as __all__
