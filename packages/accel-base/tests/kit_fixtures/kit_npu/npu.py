"""The fixture NPU's real vendor module: the names the stand-in (`npu_emulated`) must match. Importable
without an NPU; every call says there is none."""

from __future__ import annotations

from typing import Any

import torch


class GradScaler(torch.amp.GradScaler):
    """The vendor's loss scaler."""


def _none(*_: Any) -> Any:
    raise RuntimeError("no NPU in the kit's own tests")


def device_count() -> int:
    return 0


def set_device(index: int) -> None:
    _none(index)


def get_rng_state() -> Any:
    return _none()


def set_rng_state(states: Any) -> None:
    _none(states)


def manual_seed(seed: int) -> None:
    _none(seed)


def empty_cache() -> None:
    _none()
