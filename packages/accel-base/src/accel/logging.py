"""Logging from several processes: `get_logger(__name__)` logs once (on the main process) by default.

    from accel.logging import get_logger
    logger = get_logger(__name__, log_level="INFO")
    logger.info("epoch %d", epoch)                          # main process only
    logger.info("shard %d", rank, main_process_only=False)  # every process
    logger.info("in turn", in_order=True)                   # every process, rank 0 first

Messages carry a `[RANK r]` prefix. The level comes from `log_level`, else `ACCEL_LOG_LEVEL`,
else `ACCELERATE_LOG_LEVEL` (Accelerate's variable), else the logging module's own.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import MutableMapping
from typing import Any

from .distributed.state import PartialState, partial_state_exists
from .settings.env import read_env


class MultiProcessAdapter(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger adapter whose calls take `main_process_only=True` and `in_order=False`.

    `in_order=True` logs on every process, one rank after the other (each waits for the
    previous: a collective, so every process must make the call); it overrides
    `main_process_only`.

    Raises:
        RuntimeError: logging before `PartialState()` or an `Accelerator` exists (the rank is unknown).
    """

    @staticmethod
    def _should_log(main_process_only: bool) -> bool:
        return not main_process_only or PartialState().is_main_process

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs.setdefault("stacklevel", 2)
        return f"[RANK {PartialState().process_index}] {msg}", kwargs

    def log(self, level: int, msg: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        if not partial_state_exists():
            raise RuntimeError(
                "accel.logging needs to know the process: create `PartialState()` or an `Accelerator()` before "
                "logging through a logger from `get_logger`."
            )
        main_process_only = kwargs.pop("main_process_only", True)
        in_order = kwargs.pop("in_order", False)
        if not self.isEnabledFor(level):
            return
        msg, options = self.process(msg, kwargs)
        if not in_order:
            if self._should_log(main_process_only):
                self.logger.log(level, msg, *args, **options)
            return
        state = PartialState()
        for rank in range(state.num_processes):
            if rank == state.process_index:
                self.logger.log(level, msg, *args, **options)
            state.wait_for_everyone()

    @functools.lru_cache(None)  # noqa: B019 - once per message for the process's lifetime is the point
    def warning_once(self, *args: Any, **kwargs: Any) -> None:
        """`warning`, emitted only the first time these exact arguments are seen."""
        self.warning(*args, **kwargs)


def get_logger(name: str, log_level: str | None = None) -> MultiProcessAdapter:
    """A logger for `name` that logs on the main process unless told `main_process_only=False`.

    `log_level` (e.g. "INFO"), else `ACCEL_LOG_LEVEL` / `ACCELERATE_LOG_LEVEL`, sets the level
    of this logger and of the root logger, as Accelerate does.
    """
    if log_level is None:
        log_level = read_env().log_level
    logger = logging.getLogger(name)
    if log_level is not None:
        logger.setLevel(log_level.upper())
        logging.getLogger().setLevel(log_level.upper())
    return MultiProcessAdapter(logger, {})


__all__ = ["MultiProcessAdapter", "get_logger"]
