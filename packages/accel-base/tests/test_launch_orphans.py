"""Workers die with their `accel launch`: real launches, real signals, bounded in time."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from accel.cli import WORKER_BOOTSTRAP
from accel.commands.launch import GUARD_SH, _death_signal_runner

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")

LOOP = """
import os, sys, time
from pathlib import Path
out = Path(sys.argv[1])
(out / f"{os.environ['LOCAL_RANK']}.pid").write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def _alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (dead, not yet reaped by a container's init) counts as gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return state != "Z"


def _start_workers(
    tmp_path: Path, mode: str = "script", env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], list[int]]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    target = [str(script)]
    if mode == "module":
        target = ["-m", "loop"]
    elif mode == "exec":
        script.write_text(f"#!{sys.executable}\n{LOOP}")
        script.chmod(0o755)
        target = ["--no-python", str(script)]
    cmd = [sys.executable, "-m", "accel.cli", "launch", "--num-processes", "2", "--cpu", *target, str(tmp_path)]
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=tmp_path, env=env)
    deadline = time.monotonic() + 120
    pid_files = [tmp_path / "0.pid", tmp_path / "1.pid"]
    while not all(p.exists() and p.read_text() for p in pid_files):
        if launcher.poll() is not None or time.monotonic() > deadline:
            launcher.kill()
            pytest.fail(f"workers did not start: {launcher.stderr.read().decode()[-3000:]}")  # type: ignore[union-attr]
        time.sleep(0.1)
    return launcher, [int(p.read_text()) for p in pid_files]


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _stop(launcher: subprocess.Popen[bytes], pids: list[int], sig: signal.Signals = signal.SIGKILL) -> list[int]:
    """Send `sig` to the launcher: the workers still alive 10 s after it ended (then killed, whatever happens)."""
    try:
        launcher.send_signal(sig)
        launcher.wait(timeout=60)
        return _wait_gone(pids, 10)
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_workers_die_with_their_launcher(tmp_path: Path, sig: signal.Signals) -> None:
    launcher, pids = _start_workers(tmp_path)
    running = [_alive(p) for p in pids]
    left = _stop(launcher, pids, sig)
    assert running == [True, True]
    assert left == [], f"workers {left} outlived a launcher stopped by {sig.name}"
    if sig != signal.SIGKILL:
        # torchrun's own handling: the launcher stops the workers and exits non-zero.
        assert launcher.returncode != 0


@pytest.mark.parametrize("mode", ["module", "exec"])
def test_module_and_no_python_workers_die_with_a_killed_launcher(tmp_path: Path, mode: str) -> None:
    launcher, pids = _start_workers(tmp_path, mode)
    left = _stop(launcher, pids)
    assert left == [], f"{mode} workers {left} outlived a SIGKILLed launcher"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the death signal is Linux's")
@pytest.mark.parametrize("guard", ["setpriv", "python"])
def test_each_guard_runs_torchruns_command_and_dies_with_the_launcher(tmp_path: Path, guard: str) -> None:
    """util-linux's `setpriv` where it runs (a launch at torchrun's cost), else the Python bootstrap: either way
    the worker is torchrun's own `python -u SCRIPT ARGS` (same pid) and a SIGKILLed launcher takes it along."""
    env = dict(os.environ)
    if guard == "setpriv":
        if _death_signal_runner() is None:
            pytest.skip("no setpriv with --pdeathsig here")
    else:
        env["PATH"] = str(tmp_path / "empty")  # no setpriv: the launcher falls back to worker_bootstrap.py
    launcher, pids = _start_workers(tmp_path, env=env)
    argvs = [Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1] for pid in pids]
    left = _stop(launcher, pids)
    assert argvs == [[sys.executable, "-u", str(tmp_path / "loop.py"), str(tmp_path)]] * 2
    assert left == [], f"workers {left} outlived a SIGKILLed launcher ({guard})"


def test_a_worker_whose_launcher_is_gone_does_not_start(tmp_path: Path) -> None:
    """The shell guard run under `setpriv`: a parent that is not the launcher (it died before the death signal
    was armed) means the worker never starts, with the reason on stderr."""
    runner = _death_signal_runner()
    if runner is None:
        pytest.skip("no setpriv with --pdeathsig here")
    marker = tmp_path / "ran"
    cmd = [*runner[1:], "-c", GUARD_SH, "1", sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and not marker.exists()
    assert "the launcher (pid 1) is gone; not starting" in out.stderr
    ok = subprocess.run(
        [*runner[1:], "-c", GUARD_SH, str(os.getpid()), sys.executable, "-c", f"open({str(marker)!r}, 'w')"], timeout=60
    )
    assert ok.returncode == 0 and marker.exists()


def test_worker_runs_as_torchrun_would_run_it(tmp_path: Path) -> None:
    """sys.argv, __name__, sys.path[0] and the module's __spec__ match a plain `python -u` run."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    probe = (
        "import json, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'name': __name__, 'path0': sys.path[0],"
        " 'spec': __spec__ and __spec__.name, 'unbuffered': not sys.stdout.line_buffering"
        " and sys.stdout.write_through}))\n"
    )
    (pkg / "probe.py").write_text(probe)

    def run(cmd: list[str]) -> dict[str, object]:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=60, check=True).stdout
        return json.loads(out)

    me = str(os.getpid())
    for mode, target, direct in [
        ("script", str(pkg / "probe.py"), [sys.executable, "-u", str(pkg / "probe.py")]),
        ("module", "pkg.probe", [sys.executable, "-u", "-m", "pkg.probe"]),
    ]:
        via = run([sys.executable, "-u", str(WORKER_BOOTSTRAP), me, mode, target, "a", "--b=1"])
        assert via == run([*direct, "a", "--b=1"]), mode


def test_worker_whose_launcher_is_already_gone_does_not_start(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    # pid 1 is not this test's pid: to the bootstrap the launcher has died already.
    proc = subprocess.run(
        [sys.executable, str(WORKER_BOOTSTRAP), "1", "script", str(script)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode != 0
    assert "the launcher (pid 1) is gone" in proc.stderr
    assert not marker.exists()


def test_watchdog_fallback_kills_the_worker_without_prctl(tmp_path: Path) -> None:
    """Where no parent-death signal exists (not Linux), the polling watchdog does the same job."""
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    worker = (
        "import os, runpy, sys; "
        f"g = runpy.run_path({str(WORKER_BOOTSTRAP)!r}, run_name='bootstrap'); "
        "g['main'].__globals__['_set_parent_death_signal'] = lambda: False; "
        f"os.environ['LOCAL_RANK'] = '0'; g['main']([str(os.getppid()), 'script', {str(script)!r}, {str(tmp_path)!r}])"
    )
    # A stand-in launcher: starts the worker, then waits forever.
    launcher_code = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(600)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code])
    pid_file = tmp_path / "0.pid"
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline, "worker did not start"
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    launcher.kill()
    launcher.wait(timeout=30)
    left = _wait_gone([pid], 10)
    if left:
        os.kill(pid, signal.SIGKILL)
    assert left == []
