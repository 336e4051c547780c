"""Multi-process scenarios through `accel launch` (a package so its conftest never shadows a tests/ one)."""
