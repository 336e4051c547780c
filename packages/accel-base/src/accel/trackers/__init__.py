"""Experiment trackers: the base class and the built-in ones (`base`), Accelerate's third-party trackers
(`libraries`), and the registry of names that the Accelerator logs through (`hub`)."""

from .hub import TrackerHub, is_tracker_instance, register_tracker

__all__ = ["TrackerHub", "is_tracker_instance", "register_tracker"]
