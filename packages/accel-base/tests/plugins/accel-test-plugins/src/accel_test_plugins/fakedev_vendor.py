"""Stands for a vendor library that only exists on its hardware."""

raise ImportError("the fakedev vendor library exists only on fakedev machines")
