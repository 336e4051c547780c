"""The stuck-collective watchdog: a collective that waits too long says so, on every rank, in one line.

Every collective issued through accel (`accel.distributed.ops`: gather, gather_object, reduce,
broadcast, broadcast_object_list, pad_across_processes; and `wait_for_everyone`) is numbered per
process group on each rank when it starts. One daemon thread per process looks at the latest
collective started, once per half threshold at most (it is woken only when it has gone idle, never
per collective):

- after half the threshold (or half the process group's timeout, if that is shorter) it writes
  where this rank waits (`accel_watchdog/at/<rank>`: the number, the operation, the user's call
  site) to the process group's store;
- after `ACCEL_COLLECTIVE_WARN_SECONDS` (default 60) it reads the other ranks' notes and prints
  one line: the operation, its call site, and which ranks have not arrived (each one's own
  collective when it waits in another, else "not in an accel collective").

The run keeps waiting: the collective ends at the process group's timeout
(`InitProcessGroupKwargs(timeout=)`, `ACCEL_TIMEOUT`, 30 minutes by default) with a
`CollectiveTimeoutError` carrying the same line, read again then, instead of the backend's raw error.

The hot path pays a counter, a clock read, the user's frame (one cached lookup per frame) and two
attribute writes per collective, about 2 us: no store access, no extra collective, no device
synchronisation. Only a collective that outlives half the
threshold touches the store. A one-process run has no watchdog; `ACCEL_COLLECTIVE_WARN_SECONDS=0`
turns it off.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import torch.distributed as dist

from ..errors import AccelError, CollectiveTimeoutError
from .debug import format_site, user_position

F = TypeVar("F", bound=Callable[..., Any])

_PREFIX = "accel_watchdog/at"
_dog: Watchdog | None = None


class _Call(NamedTuple):
    seq: int
    op: str
    group: Any
    start: float
    site: tuple[Any, int]  # the user's code object and instruction (`debug.format_site` makes it file:line)


class Watchdog:
    """This process's watchdog (`install` makes it; the collectives in `accel.distributed.ops` report to it)."""

    def __init__(self, *, warn_after: float, timeout: float, rank: int, store: Any) -> None:
        self.warn_after = warn_after
        self.timeout = timeout
        self.rank = rank
        self.store = store
        self.current: _Call | None = None
        """The collective in flight (None between collectives)."""
        self.latest: _Call | None = None
        """The last collective started: the thread looks at each in turn, without being woken for each."""
        self._seq: dict[Any, int] = {}
        self._warned: _Call | None = None  # the last call it warned about
        self._wake = threading.Event()
        threading.Thread(target=self._watch, name="accel-collective-watchdog", daemon=True).start()

    # ---- the hot path ------------------------------------------------------------------------
    def enter(self, op: str, group: Any, frame: Any) -> _Call:
        seq = self._seq[group] = self._seq.get(group, 0) + 1
        # The location, not the frame: a frame held until the watchdog looks would keep its tensors alive.
        call = self.current = self.latest = _Call(seq, op, group, time.monotonic(), user_position(frame))
        if not self._wake.is_set():  # set only once the thread has gone idle: no thread switch per collective
            self._wake.set()
        return call

    def failed(self, call: _Call, exc: BaseException) -> BaseException:
        """What to raise for `exc` from `call`: a `CollectiveTimeoutError` naming the ranks that never arrived once
        the wait was long enough to be reported (or to be the timeout), else `exc` itself (a peer's connection
        closed at once, a bad argument, accel's own errors)."""
        waited = time.monotonic() - call.start
        if isinstance(exc, AccelError) or (
            self._warned is not call and waited < 0.95 * min(self.warn_after, self.timeout)
        ):
            return exc  # accel's own error (debug mode's) already says what happened
        how = f"timed out after {waited:.0f} s" if waited >= 0.95 * self.timeout else f"failed after {waited:.0f} s"
        # gloo's "[/path/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete"
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split("] ", 1)[-1]
        try:
            self._publish(call)
            where = self._describe(call, how)
        except Exception:  # the process group itself is gone: the backend's error is all there is
            return exc
        return CollectiveTimeoutError(
            f"{where} (the process group's timeout is {self.timeout:g} s; backend: {first}). Every rank must make "
            "the same collective calls in the same order (`accel launch --debug` names the first mismatch)"
        )

    # ---- the thread --------------------------------------------------------------------------
    def _watch(self) -> None:
        seen: _Call | None = None
        while True:
            self._wake.wait()
            call = self.latest
            if call is seen or call is None:  # nothing started since the last look: sleep until `enter` wakes it
                self._wake.clear()
                call = self.latest  # an `enter` that found the event still set just before the clear
                if call is seen or call is None:
                    continue
            seen = call
            if self._sleep_until(call, call.start + min(self.warn_after, self.timeout) / 2):
                self._publish(call)
                if self.warn_after < self.timeout and self._sleep_until(call, call.start + self.warn_after):
                    self._warn(call)
                while self.current is call:  # stuck: look again once it has ended
                    time.sleep(0.2)

    def _warn(self, call: _Call) -> None:
        line = self._describe(call, f"has waited {self.warn_after:g} s")
        if self.current is call:
            self._warned = call
            # One write with its newline: `print` writes the end apart, and another rank's line, written
            # to the same stderr at the same moment, can land between them.
            sys.stderr.write(f"accel: {line}; still waiting, up to the process group's timeout ({self.timeout:g} s)\n")
            sys.stderr.flush()

    def _sleep_until(self, call: _Call, when: float) -> bool:
        """Sleep until `when`; whether `call` is still in flight then."""
        delay = when - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return self.current is call

    # ---- the store ---------------------------------------------------------------------------
    def _publish(self, call: _Call) -> None:
        note = {"seq": call.seq, "op": call.op, "site": format_site(*call.site), "group": self._ranks(call.group)}
        try:
            self.store.set(f"{_PREFIX}/{self.rank}", json.dumps(note))
        except Exception:  # the store's host has gone: the line names this rank's own call only
            pass

    def _ranks(self, group: Any) -> list[int]:
        return list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)

    def _note(self, rank: int) -> dict[str, Any] | None:
        key = f"{_PREFIX}/{rank}"
        try:
            return json.loads(self.store.get(key)) if self.store.check([key]) else None
        except Exception:
            return None

    def _describe(self, call: _Call, how: str) -> str:
        ranks = self._ranks(call.group)
        missing = []
        for rank in ranks:
            if rank == self.rank:
                continue
            note = self._note(rank)
            if note is None:
                missing.append(f"rank {rank} (not in an accel collective)")
            elif note["group"] != ranks or note["seq"] != call.seq or note["op"] != call.op:
                missing.append(f"rank {rank} (waits in `{note['op']}` #{note['seq']} at {note['site']})")
        who = (
            f"not arrived: {', '.join(missing)}"
            if missing
            else "every rank has arrived (the transfer itself is slow or stuck)"
        )
        return (
            f"rank {self.rank} {how} in `{call.op}` (accel collective #{call.seq}) at {format_site(*call.site)}; {who}"
        )


def install(*, warn_after: float, timeout: float) -> None:
    """Watch this process's collectives (the process group is started); `warn_after <= 0` turns the watchdog off."""
    global _dog
    try:
        store = dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):
        store = None
    if warn_after <= 0 or store is None:
        _dog = None
        return
    _dog = Watchdog(warn_after=warn_after, timeout=timeout, rank=dist.get_rank(), store=store)


def uninstall() -> None:
    """Stop watching (the process group is gone)."""
    global _dog
    _dog = None


def watched(op: str, group_at: int | None = None) -> Callable[[F], F]:
    """Report each call of the decorated collective to the watchdog; `group_at`: the position of its `group`
    argument (also accepted by keyword)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            dog = _dog
            if dog is None or dog.current is not None:  # off, or inside another watched collective
                return fn(*args, **kwargs)
            group = kwargs.get("group") if group_at is None or len(args) <= group_at else args[group_at]
            call = dog.enter(op, group, sys._getframe(1))
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                error = dog.failed(call, exc)
                if error is exc:
                    raise
                raise error from None  # its message carries the backend's: no second traceback
            finally:
                dog.current = None

        return wrapper  # type: ignore[return-value]

    return decorate
