"""The soak's deployment processes: a process killed with SIGKILL and started again leaves nothing behind."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks import soak

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
