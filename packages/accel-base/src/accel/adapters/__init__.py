"""Adapters that ship with the core (only `cpu`); hardware adapters are separate packages."""
