"""A minimal accel adapter (docs/adapters.md walks through it)."""

from .adapter import ExampleAdapter, ExampleOptions

__all__ = ["ExampleAdapter", "ExampleOptions"]
