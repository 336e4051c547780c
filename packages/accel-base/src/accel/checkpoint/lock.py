"""Advisory locks on a checkpoint directory: one save at a time, and loads that never see a save's moves.

Two `fcntl.flock` locks on files accel creates in the checkpoint directory. The operating system
releases them when their process dies, so a crash never leaves a directory locked.

- `.accel-save.lock`: exclusive for a whole save (and while rotation removes the checkpoint).
  A second save into the directory waits for the first. The holder writes its pid, host and
  start time into it: a waiting process names them.
- `.accel-files.lock`: shared by loads while they read; exclusive while a save or rotation
  changes which files are the checkpoint (finishing an interrupted commit, sealing and
  committing, removing). A save writes its files into its staging directory without it, so a
  load meanwhile reads the previous checkpoint, whole, and never the save's files in flight.

Waits are bounded (`WAIT_SECONDS`): a log line names the holder once a wait gets long, and a
`CheckpointError` names it when the wait ends. The process that holds a lock exclusively
removes its file when it lets go (every process that gets a lock checks that the file it locked
still has that name), so a directory keeps no trace of them. In a run of several processes only
the process that writes the directory takes them; the others follow it through the agreement
every checkpoint phase ends with, so no two ranks ever wait for each other here. A filesystem
without locks, or a load from a read-only directory, goes on unlocked.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
import stat
import threading
import time
from pathlib import Path

from ..errors import CheckpointError

SAVE_LOCK = ".accel-save.lock"
FILES_LOCK = ".accel-files.lock"
LOCK_NAMES = (SAVE_LOCK, FILES_LOCK)
WAIT_SECONDS = 600.0
"""How long a save or load waits for another process's lock before it fails (below the 30
minutes collectives wait, so that the other ranks hear of it through their agreement)."""
_NOTICE_SECONDS = 2.0
_UNLOCKABLE = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL, errno.EROFS, errno.EACCES, errno.EPERM)


class DirectoryLock:
    """One lock file of a checkpoint directory, held shared or exclusive by this process."""

    def __init__(self, directory: Path, name: str) -> None:
        self.path = directory / name
        self.fd: int | None = None
        self.exclusive = False

    def take(self, exclusive: bool, what: str, *, wait: bool = True) -> bool:
        """Lock it; False where it cannot be locked here (no such directory, no locks on this filesystem).

        Raises:
            CheckpointError: another process held it for `WAIT_SECONDS` (or at all, without `wait`).
        """
        deadline = time.monotonic() + (WAIT_SECONDS if wait else 0.0)
        op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, *_UNLOCKABLE):
                    return False
                raise
            try:
                fcntl.flock(fd, op | fcntl.LOCK_NB)
                taken = True
            except BlockingIOError:
                taken = _wait_for(fd, op, deadline, self.path.parent, what)
                if not taken:  # _wait_for closed fd
                    raise CheckpointError(
                        f"{what}: {self.path.parent} is in use by {holder(self.path.parent)}, for more than "
                        f"{WAIT_SECONDS:g} s. Wait for it to finish, or use another directory."
                    ) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno in _UNLOCKABLE:
                    logging.getLogger("accel").warning(
                        "%s: %s cannot be locked on this filesystem (%s); concurrent saves and loads there are not "
                        "kept apart.",
                        what,
                        self.path.parent,
                        exc,
                    )
                    return False
                raise
            # The holder we waited for may have removed the file: hold the one that has the name now.
            if taken and _same_file(fd, self.path):
                self.fd, self.exclusive = fd, exclusive
                return True
            os.close(fd)

    def note_holder(self, what: str) -> None:
        """Write this process's pid, host and the time into the (exclusively held) lock file."""
        if self.fd is None:
            return
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "what": what})
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text.encode(), 0)

    def release(self) -> None:
        """Let go; the file goes too when no other process holds it."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            if not self.exclusive:
                # Only a sole holder may remove the file: try to become one, without waiting.
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    return
            if _same_file(fd, self.path):
                self.path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        mine, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)


def _wait_for(fd: int, op: int, deadline: float, directory: Path, what: str) -> bool:
    """`flock(fd, op)`, blocking until `deadline`. True: locked. False: timed out, and `fd` is closed.

    The kernel wakes a blocked `flock` the moment the holder lets go (polling could miss every
    short gap between two saves), so the wait runs in a thread; one that gives up leaves `fd` to
    that thread, which closes it (releasing the lock if it got it meanwhile).
    """
    done = threading.Event()
    guard = threading.Lock()
    abandoned: list[bool] = []
    failure: list[OSError] = []

    def take() -> None:
        try:
            fcntl.flock(fd, op)
        except OSError as exc:
            failure.append(exc)
        with guard:
            done.set()
            if abandoned:
                os.close(fd)

    threading.Thread(target=take, name="accel-checkpoint-lock", daemon=True).start()
    try:
        if not done.wait(max(0.0, min(_NOTICE_SECONDS, deadline - time.monotonic()))):
            logging.getLogger("accel").warning(
                "%s waits for %s to finish with %s (at most %g s).", what, holder(directory), directory, WAIT_SECONDS
            )
            done.wait(max(0.0, deadline - time.monotonic()))
    finally:
        with guard:
            finished = done.is_set()
            if not finished:
                abandoned.append(True)
    if finished and failure:
        os.close(fd)
        raise failure[0]
    return finished


def holder(directory: Path) -> str:
    """Who holds `directory`'s save lock, as its holder recorded it ("another process" when unknown)."""
    try:
        # Non-blocking, and only a regular file: whatever sits at that name must not stall a message.
        fd = os.open(directory / SAVE_LOCK, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            info = json.loads(f.read(4096)) if stat.S_ISREG(os.fstat(fd).st_mode) else {}
        since = time.strftime("%H:%M:%S", time.localtime(float(info["since"])))
        return f"pid {int(info['pid'])} on host {info['host']} ({info['what']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (a save, or a load still reading)"


class CheckpointLocks:
    """Both locks of one checkpoint directory, for one save, load or removal by this process."""

    def __init__(self, directory: Path, what: str) -> None:
        self.what = what
        self.save = DirectoryLock(directory, SAVE_LOCK)
        self.files = DirectoryLock(directory, FILES_LOCK)

    def for_save(self) -> None:
        """The save lock, for a whole save: the only writer of this directory from now on."""
        if self.save.take(exclusive=True, what=self.what):
            self.save.note_holder(self.what)

    def change_files(self) -> None:
        """The files lock, exclusively: no load is reading (`done_changing` lets go)."""
        self.files.take(exclusive=True, what=self.what)

    def done_changing(self) -> None:
        self.files.release()

    def for_reading(self) -> None:
        """The files lock, shared with other loads: no save changes the checkpoint's files meanwhile."""
        self.files.take(exclusive=False, what=self.what)

    def release(self) -> None:
        self.files.release()
        self.save.release()
