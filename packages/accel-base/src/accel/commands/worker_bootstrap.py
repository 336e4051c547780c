"""Start one `accel launch` worker so that it dies with its launcher.

torchrun starts each worker in a new session and stops it only when the launcher asks:
a launcher killed with SIGKILL asks nothing, and its workers train on forever. `accel
launch` therefore starts every worker as

    python -u worker_bootstrap.py LAUNCHER_PID (script|module|exec) TARGET [ARGS...]

On Linux this asks the kernel for SIGKILL when the parent dies (`PR_SET_PDEATHSIG`),
checks the parent is still `LAUNCHER_PID` (it may have died before the request), and
replaces itself with exactly the command torchrun would have run (`python -u TARGET`,
`python -u -m TARGET`, or `TARGET` itself): same pid, same signals, same exit code; the
death signal survives the exec. Elsewhere a daemon thread polls the parent and the target
runs in this interpreter the way `python` would run it.

This file runs as a script before the user's code, so it imports no part of accel (and
no torch): it costs one bare interpreter start per worker. On Linux `accel launch` runs it
as `python -I -S` (isolated, no `site`: nothing but the standard library is needed before
the exec); elsewhere as `python -u`, where its own folder is first on `sys.path` and it
imports only standard modules that no accel module shadows.
"""

from __future__ import annotations

import os
import signal
import sys

PR_SET_PDEATHSIG = 1
MODES = ("script", "module", "exec")
POLL_SECONDS = 0.5


def _set_parent_death_signal() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(launcher_pid: int) -> None:
    """Kill this process once its parent is no longer the launcher (non-Linux fallback)."""
    import threading
    import time

    def watch() -> None:
        while os.getppid() == launcher_pid:
            time.sleep(POLL_SECONDS)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="accel-parent-watchdog", daemon=True).start()


def _mark_started() -> None:
    """Tell the launcher's progress line this worker runs the script (`launch_progress`, by its folder)."""
    folder = os.environ.get(
        "ACCEL_LAUNCH_PROGRESS_DIR"
    )  # accel.settings.launch.PROGRESS_DIR_ENV (no accel import here)
    if folder:
        try:
            open(os.path.join(folder, f"started-{os.environ.get('LOCAL_RANK', '0')}"), "w").close()
        except OSError:
            pass  # the launcher is no longer listening


def _exec_target(mode: str, target: str, args: list[str]) -> None:
    if mode == "exec":
        os.execvp(target, [target, *args])
    flags = ["-u", "-m"] if mode == "module" else ["-u"]
    os.execv(sys.executable, [sys.executable, *flags, target, *args])


def _run_in_process(mode: str, target: str, args: list[str]) -> None:
    import runpy

    if mode == "exec":
        # A foreign executable cannot host the watchdog thread: it runs unguarded. Windows has
        # no real exec (os.exec* starts a new process and ends this one, which the launcher
        # would read as the worker's exit), so there it runs as a child.
        if sys.platform == "win32":
            import subprocess

            sys.exit(subprocess.call([target, *args]))
        os.execvp(target, [target, *args])
    if mode == "module":
        sys.argv = [target, *args]  # runpy replaces argv[0] with the module's file
        sys.path[0] = os.getcwd()  # as `python -m`; this file's folder (accel's) must not shadow user modules
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    sys.argv = [target, *args]
    # `python script.py` puts the script's folder first on the path, not the caller's cwd.
    sys.path[0] = os.path.dirname(os.path.realpath(target))
    runpy.run_path(target, run_name="__main__")


def main(argv: list[str]) -> None:
    if len(argv) < 3 or argv[1] not in MODES or not argv[0].isdigit():
        sys.exit(f"usage: worker_bootstrap.py LAUNCHER_PID {{{','.join(MODES)}}} TARGET [ARGS...]; got {argv}")
    launcher_pid, mode, target, args = int(argv[0]), argv[1], argv[2], argv[3:]
    guarded = _set_parent_death_signal()
    if os.getppid() != launcher_pid:
        # The launcher died before the death signal was armed: nothing would ever stop us.
        sys.exit(f"accel launch worker: the launcher (pid {launcher_pid}) is gone; not starting {target}")
    _mark_started()
    if guarded:
        _exec_target(mode, target, args)
    else:
        _watch_parent(launcher_pid)
        _run_in_process(mode, target, args)


if __name__ == "__main__":
    main(sys.argv[1:])
