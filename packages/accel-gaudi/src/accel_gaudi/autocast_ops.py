"""optimum-habana's `declare_autocast_bf16_fp32_ops`: Habana's autocast takes its op lists from two files named
by environment variables, which the bridge reads once, when it loads. The lists are written here, to files of
the process that declares them (removed when it exits), never to a shared fixed path two ranks would race on.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import tempfile
from collections.abc import Iterable, Mapping

LOWER_PRECISION_LIST_ENV = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
"""The file of ops Habana's autocast runs in bf16."""
FP32_LIST_ENV = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
"""The file of ops Habana's autocast runs in fp32."""


def read_op_list(path: str) -> tuple[str, ...]:
    """The op names in `path`, one a line (blank lines skipped)."""
    with open(path, encoding="utf-8") as f:
        return tuple(line.strip() for line in f if line.strip())


def declared_lists(env: Mapping[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(bf16 ops, fp32 ops) from the files `env` names, or None when either variable is unset or unreadable."""
    paths = env.get(LOWER_PRECISION_LIST_ENV), env.get(FP32_LIST_ENV)
    if not paths[0] or not paths[1]:
        return None
    try:
        return read_op_list(paths[0]), read_op_list(paths[1])
    except OSError:
        return None


def same_lists(a: tuple[Iterable[str], Iterable[str]] | None, b: tuple[Iterable[str], Iterable[str]] | None) -> bool:
    """Whether two (bf16, fp32) declarations name the same ops (order and repeats aside)."""
    if a is None or b is None:
        return a is b
    return all(set(x) == set(y) for x, y in zip(a, b))


def write_op_lists(bf16_ops: Iterable[str], fp32_ops: Iterable[str]) -> dict[str, str]:
    """Write the two lists, one op a line, to new files of this process (removed when it exits); returns the
    variables that name them."""
    out: dict[str, str] = {}
    for var, ops, tag in ((LOWER_PRECISION_LIST_ENV, bf16_ops, "bf16"), (FP32_LIST_ENV, fp32_ops, "fp32")):
        fd, path = tempfile.mkstemp(prefix=f"accel_gaudi_autocast_{tag}_", suffix=".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(op + "\n" for op in ops)
        atexit.register(_remove, path)
        out[var] = path
    return out


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)
