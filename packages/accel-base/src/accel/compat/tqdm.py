"""`tqdm` that shows its bar on the main process only (Accelerate's `utils.tqdm`)."""

from __future__ import annotations

from typing import Any


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """`tqdm.auto.tqdm(*args, **kwargs)`, disabled on every process but each node's first when `main_process_only`.

    Raises:
        ImportError: tqdm is not installed (`pip install tqdm`).
        ValueError: a bool as first argument (pass `main_process_only=` by keyword).
    """
    try:
        from tqdm.auto import tqdm as _tqdm
    except ImportError as exc:
        raise ImportError("accel.utils.tqdm needs tqdm: `pip install tqdm`.") from exc
    if args and isinstance(args[0], bool):
        raise ValueError("Pass `main_process_only` by keyword; a bool as first argument of tqdm is not supported.")
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        from ..distributed.state import PartialState

        disable = PartialState().local_process_index != 0
    return _tqdm(*args, **kwargs, disable=disable)
