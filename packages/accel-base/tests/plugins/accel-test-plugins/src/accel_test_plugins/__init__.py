"""Test adapters for accel-base: installed through real entry points into the test venv."""
