"""A plugin that fails at import, as a package with a missing dependency does."""

import accel_missing_vendor_sdk  # noqa: F401

BrokenAdapter = None
