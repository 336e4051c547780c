"""`Accelerator.prepare`: the walk (`walk`), the one context it hands out (`context`), pairing models with
their optimizers and schedulers (`group`), the registry of prepared objects (`prepared`), and what prepared
objects are wrapped in (`wrappers`: torch.compile, `AcceleratedOptimizer`, `AcceleratedScheduler`)."""

from .context import PrepareContext, RunContext

__all__ = ["PrepareContext", "RunContext"]
