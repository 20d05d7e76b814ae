"""The soak's deployment processes: a process killed with SIGKILL and started again leaves nothing behind, and a
soak sent SIGTERM or SIGINT stops every process it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import soak

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _child_of(start: int, pid_file: Path) -> int:
    """The pid the process's shell wrote for its child (after ``start``'s write)."""
    deadline = time.monotonic() + 60  # a guard for a shell that never starts, not what is tested
    while not (pid_file.exists() and pid_file.read_text().endswith("\n")) or int(pid_file.read_text()) == start:
        assert time.monotonic() < deadline, "the shell did not start its child"
        time.sleep(0.05)
    return int(pid_file.read_text())


_BURN = """
import os, pathlib, sys, time
while time.process_time() < float(sys.argv[1]):
    pass
pathlib.Path(sys.argv[2]).write_text(str(os.getpid()))
time.sleep(120)
"""
#: The meter's root: a process that burnt 2 s before the meter starts (and stays), then, told to, one that
#: starts a burner of 1.5 s and leaves once it burnt, reaping nothing (as a run worker leaves its Spark driver).
_ROOT = """
import pathlib, subprocess, sys, time
burn, here = sys.argv[1], pathlib.Path(sys.argv[2])
def wait(name):
    while not (here / name).exists():
        time.sleep(0.05)
subprocess.Popen([sys.executable, "-c", burn, "2.0", str(here / "before")])
wait("before")
(here / "ready").touch()
wait("go")
leaving = ("import pathlib, subprocess, sys, time\\n"
           f"subprocess.Popen([sys.executable, '-c', {burn!r}, '1.5', {str(here / 'after')!r}])\\n"
           f"while not pathlib.Path({str(here / 'after')!r}).exists(): time.sleep(0.05)\\n"
           "time.sleep(1.0)\\n")
subprocess.run([sys.executable, "-c", leaving], check=True)
(here / "done").touch()
time.sleep(120)
"""


def _appeared(path: Path) -> None:
    deadline = time.monotonic() + 60  # a guard for a process that never gets there, not what is tested
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never came"
        time.sleep(0.05)


def test_the_cpu_meter_counts_a_process_that_outlives_its_parent_and_not_what_came_before(tmp_path: Path) -> None:
    """A run's Spark driver outlives the run worker that started it, and no process of the soak reaps it: its
    CPU counts all the same (sampled while it runs; measured at the end from the parents' reaped children, a
    soak's deployment showed 36 % of a machine 96 % busy with nothing else). What the processes alive when the
    meter starts spent before it does not count."""
    root = subprocess.Popen([sys.executable, "-c", _ROOT, _BURN, str(tmp_path)], start_new_session=True)
    try:
        _appeared(tmp_path / "ready")
        with soak.CpuMeter("0", interval=0.2, root=root.pid) as meter:
            (tmp_path / "go").touch()
            _appeared(tmp_path / "done")
        outliving = int((tmp_path / "after").read_text())
        assert f"PPid:\t{root.pid}\n" not in Path(f"/proc/{outliving}/status").read_text()  # it outlived its parent
        assert 1.5 <= meter.seconds < 1.5 + 1.0, meter.seconds  # the burner's and its parent's, not the 2 s before
    finally:
        for pid in (int(f.read_text()) for f in (tmp_path / "before", tmp_path / "after") if f.exists()):
            os.kill(pid, signal.SIGKILL)
        root.kill()
        root.wait()


def test_a_process_killed_and_started_again_leaves_no_orphan(tmp_path: Path) -> None:
    """As the daemon killed with SIGKILL leaves its code server: the restart ends the child left in the killed
    start's process group, and stop ends the new start's child with it."""
    pid_file = tmp_path / "child.pid"
    script = f'sleep 600 & echo $! > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}; wait'
    process = soak.Process("daemon", ["sh", "-c", script], dict(os.environ), tmp_path)
    first = _child_of(0, pid_file)
    process.kill()
    assert _running(first)  # an orphan, as after a crash
    process.start()
    assert not _running(first)
    second = _child_of(first, pid_file)
    assert _running(second)
    process.stop()
    assert not _running(second)


_SLEEPER = """
import os, sys, time
from contextlib import ExitStack
from pathlib import Path
from benchmarks import soak
logs = Path(sys.argv[1])
with soak.stopped_by_signals(), ExitStack() as stack:
    sleeper = soak.Process("sleeper", ["sh", "-c", f"sleep 600 & echo $! > {logs}/child.pid; wait"], dict(os.environ), logs)
    stack.callback(sleeper.stop)
    print(sleeper.popen.pid, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_processes_the_soak_started(tmp_path: Path, signum: signal.Signals) -> None:
    """A process started in a session of its own is beyond a signal to the soak; the soak stops it on the way
    out, after SIGTERM (whose default ends the soak alone) as after SIGINT."""
    soak_process = subprocess.Popen([sys.executable, "-c", _SLEEPER, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                                    text=True)
    try:
        assert soak_process.stdout is not None
        shell = int(soak_process.stdout.readline())
        child = _child_of(0, tmp_path / "child.pid")
        soak_process.send_signal(signum)
        soak_process.wait(timeout=120)  # a guard, not what is tested
    finally:
        soak_process.kill()
    assert not _running(shell) and not _running(child)


def _ours(path: Path) -> list[str]:
    """The processes whose command line or environment names ``path``: the deployment's."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if str(path).encode() in cmdline + (proc / "environ").read_bytes():
                found.append(f"{proc.name}: {cmdline.replace(bytes(1), b' ').decode(errors='replace')[:200]}")
        except OSError:  # ended meanwhile, or a process of another user's
            continue
    return found


@pytest.mark.slow
@pytest.mark.daemon
def test_sigterm_stops_the_whole_deployment(tmp_path: Path) -> None:
    """SIGTERM to a running soak, with a run executing: the daemon, webserver, code server, run worker, MongoDB
    and PostgreSQL all end, and the soak with them."""
    root = tmp_path / "soak"
    env = os.environ | {"PYTHONUNBUFFERED": "1"}  # its lines as they are printed
    soak_process = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.soak", "--minutes", "10", "--collections", "2", "--root", str(root),
         "--out", str(tmp_path / "soak.json")],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert soak_process.stdout is not None
        lines = []
        for line in soak_process.stdout:  # until the deployment is up (or the soak ends, failing below)
            lines.append(line)
            if line.startswith("deployment up:"):
                break
        found = re.search(r"^deployment up: .*PostgreSQL instance on :(\d+)", "".join(lines), re.MULTILINE)
        assert found, "".join(lines[-50:])
        pg_port = found.group(1)

        def running() -> dict[str, list[int]]:
            kinds = {"daemon": b"dagster-daemon", "webserver": b"dagster-webserver", "code server": b"code-server",
                     "run worker": b"spawn_main", "emulator": b"emulator", "postgres": b"postgres"}
            pids = soak.deployment_pids(pg_port, soak_process.pid)
            return {kind: [pid for pid in pids if text in soak._cmdline(pid)] for kind, text in kinds.items()}

        deadline = time.monotonic() + 600  # a guard: the first snapshot run starts its worker within seconds
        while not all((started := running()).values()):
            assert time.monotonic() < deadline and soak_process.poll() is None, started
            time.sleep(0.2)
        soak_process.send_signal(signal.SIGTERM)
        soak_process.wait(timeout=300)
    finally:  # a failed test stops the deployment too
        if soak_process.poll() is None:
            soak_process.send_signal(signal.SIGTERM)
            soak_process.wait(timeout=300)
    assert soak_process.returncode == 128 + signal.SIGTERM
    assert not [pid for pids in started.values() for pid in pids if _running(pid)], started
    assert not _ours(root), _ours(root)
