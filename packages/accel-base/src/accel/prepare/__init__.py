"""`Accelerator.prepare`: the walk (`walk`), its context (`context`), pairing models with their optimizers
and schedulers (`group`), the registry of prepared objects (`prepared`), compilation (`compile`), and the
optimizer and scheduler wrappers (`optimizer`, `scheduler`)."""

from .context import PrepareContext

__all__ = ["PrepareContext"]
