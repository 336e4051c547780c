"""Stand-in `accelerate` package put on PYTHONPATH by `accel.as_accelerate`: it becomes accel.

Child processes of a run under `python -m accel.as_accelerate` import this file instead of the
Accelerate; it installs the same alias and replaces itself with the `accel` module.
"""

import sys

from ....as_accelerate import install

install()
_module = sys.modules["accelerate"]
