"""`Accelerator.prepare`: the walk (`walk`), the one context it hands out (`context`), pairing models with
their optimizers and schedulers (`group`), the registry of prepared objects (`prepared`), compilation
(`compile`), and the optimizer and scheduler wrappers (`optimizer`, `scheduler`)."""

from .context import PrepareContext, RunContext

__all__ = ["PrepareContext", "RunContext"]
