"""`make dev` (``python -m mongocdc_dagster.local_stack``) as a process: it starts cleanly and stops its whole tree.

Linux only (processes are read from /proc), like the rest of the local stack's process handling.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mongocdc_dagster import local_stack
from mongocdc_devstack.fixture import free_port

pytestmark = [pytest.mark.slow, pytest.mark.daemon, pytest.mark.timeout(900),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")]

#: What the stack is made of, by a piece of each process's command line.
PARTS = {"emulator": "mongocdc_devstack.server", "dagster dev": " dev -h 127.0.0.1", "webserver": "dagster_webserver",
         "daemon": "dagster._daemon", "code server": "code-server start"}


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    state: str
    start: int  # clock ticks after boot: with the pid, names one process even if the pid is reused
    command: str


def _processes() -> dict[int, Proc]:
    found: dict[int, Proc] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended while being read
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        found[int(entry)] = Proc(int(entry), int(fields[1]), int(fields[2]), fields[0], int(fields[19]), command)
    return found


def _tree(root: int) -> list[Proc]:
    """``root`` and every live process descended from it."""
    processes = _processes()
    tree = [processes[root]] if root in processes else []
    for proc in tree:
        tree += [p for p in processes.values() if p.ppid == proc.pid and p.state != "Z"]
    return tree


def _alive(proc: Proc, now: dict[int, Proc]) -> bool:
    same = now.get(proc.pid)
    return same is not None and same.start == proc.start and same.state != "Z"


def test_runpy_does_not_warn_when_the_launcher_starts() -> None:
    """The package does not import the launcher, so ``-m`` runs it without runpy's RuntimeWarning."""
    result = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-m", "mongocdc_dagster.local_stack",
                             "--help"], cwd=local_stack.REPO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "RuntimeWarning" not in result.stderr, result.stderr


@dataclass
class _Stack:
    """A `make dev` being tested: its launcher, its log, its ports and its processes once all parts run."""

    launcher: subprocess.Popen[bytes]
    log: Path
    port: int
    seen: list[Proc]

    def left_behind(self) -> tuple[list[str], list[str]]:
        """Its processes still alive, and any process still in one of their process groups."""
        groups = {p.pgid for p in self.seen}
        now = _processes()
        return ([p.command[:100] for p in self.seen if _alive(p, now)],
                [p.command[:100] for p in now.values() if p.pgid in groups and p.state != "Z"])


def _all_parts_run(stack: _Stack) -> bool:
    return all(any(part in p.command for p in stack.seen) for part in PARTS.values())


@contextlib.contextmanager
def _make_dev(tmp_path: Path, prefix: list[str], ready: Callable[[_Stack], bool] = _all_parts_run,
              poll_s: float = 1.0) -> Iterator[_Stack]:
    """`make dev` (the launcher after ``prefix``) on free ports, once ``ready`` (by default: every part of its
    stack runs); whatever the test did, nothing of it is left after."""
    env = {k: v for k, v in os.environ.items() if k not in ("MONGOCDC_HOME", "MONGOCDC_CONFIG", "DAGSTER_HOME")}
    port, ui_port = free_port("127.0.0.1"), free_port("127.0.0.1")
    log = tmp_path / "make-dev.log"
    with open(log, "wb") as out:
        launcher = subprocess.Popen(
            [*prefix, sys.executable, "-m", "mongocdc_dagster.local_stack", "--port", str(port),
             "--dagster-port", str(ui_port), "--home", str(tmp_path / "home"), "--dagster-home", str(tmp_path / "dagster")],
            cwd=local_stack.REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    stack = _Stack(launcher, log, port, [])
    try:
        deadline = time.monotonic() + 600  # a guard for a stack that never comes up, not what is tested
        while not ready(stack):
            assert launcher.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"the stack did not start: {[p.command[:80] for p in stack.seen]}"
            time.sleep(poll_s)
            stack.seen = _tree(launcher.pid)
        yield stack
    finally:
        for proc in reversed(stack.seen):  # a failed run leaves nothing behind either
            if _alive(proc, _processes()):
                os.kill(proc.pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def _tcp(pid: int, port: int, state: str) -> set[int]:
    """The socket inodes of ``pid``'s TCP sockets in ``state`` (kernel code: 01 established, 0A listening)
    whose local (listening) or remote (established) port is ``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(int(target[len("socket:["):-1]))
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address = fields[1] if state == "0A" else fields[2]
        if fields[3] == state and int(address.split(":")[1], 16) == port and int(fields[9]) in inodes:
            found.add(int(fields[9]))
    return found


def test_sigterm_from_a_non_interactive_shell_stops_the_whole_stack(tmp_path: Path) -> None:
    """Started as a non-interactive shell starts a background command (own session, SIGINT ignored), SIGTERM
    stops the emulator, `dagster dev`, its webserver, daemon and code server: none of them is left."""
    with _make_dev(tmp_path, ["sh", "-c", 'trap "" INT; exec "$0" "$@"']) as stack:
        os.kill(stack.launcher.pid, signal.SIGTERM)
        try:
            code = stack.launcher.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail("SIGTERM did not stop `make dev`:\n" + stack.log.read_text(errors="replace")[-3000:])
        left, in_groups = stack.left_behind()
        assert not left and not in_groups, (left, in_groups)
        assert code == 0
        text = stack.log.read_text(errors="replace")
        assert "Dagster services shut down." in text and "RuntimeWarning" not in text


@pytest.mark.parametrize("victim", ["emulator", "daemon"])
def test_a_part_of_the_stack_that_dies_stops_make_dev_and_nothing_is_left(tmp_path: Path, victim: str) -> None:
    """The emulated MongoDB killed (Dagster's sensors and runs then only retry), or Dagster's daemon killed with
    SIGKILL (`dagster dev` then stops itself): `make dev` notices, says which part ended, exits 1, and leaves no
    process behind (what was left in `dagster dev`'s process group, code servers included)."""
    with _make_dev(tmp_path, []) as stack:
        target = next(p for p in stack.seen if PARTS[victim] in p.command)
        os.kill(target.pid, signal.SIGKILL)
        try:
            code = stack.launcher.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"make dev kept running without its {victim}:\n" + stack.log.read_text(errors="replace")[-3000:])
        left, in_groups = stack.left_behind()
        assert not left and not in_groups, (left, in_groups)
        text = stack.log.read_text(errors="replace")
        said = {"emulator": f"the emulated MongoDB on {local_stack.emulator_uri(stack.port)} exited with code -9",
                "daemon": "`dagster dev` ended with code"}[victim]
        assert code == 1 and said in text and "stopping make dev" in text, text[-3000:]


def test_an_emulator_that_dies_while_make_dev_seeds_it_is_one_line_and_nothing_is_left(tmp_path: Path) -> None:
    """The emulated MongoDB killed while the launcher seeds the demo data (before `dagster dev` starts): one
    error line naming it and its log file, no traceback, exit 1, no process left, `dagster dev` never started.
    The launcher is held (SIGSTOP) until the emulator listens, which is then held while the launcher connects,
    so the kill lands in the seeding whatever the machine's speed."""
    def emulator_started(stack: _Stack) -> bool:
        if any(PARTS["emulator"] in p.command for p in stack.seen):
            os.kill(stack.launcher.pid, signal.SIGSTOP)
            return True
        return False

    with _make_dev(tmp_path, [], ready=emulator_started, poll_s=0.02) as stack:
        emulator = next(p for p in stack.seen if PARTS["emulator"] in p.command)
        deadline = time.monotonic() + 300  # guards, not what is tested
        while not _tcp(emulator.pid, stack.port, "0A"):
            assert time.monotonic() < deadline, "the emulator never listened"
            time.sleep(0.1)
        os.kill(emulator.pid, signal.SIGSTOP)
        os.kill(stack.launcher.pid, signal.SIGCONT)
        held: set[int] = set()
        while not held:  # a connection of the seeding's client (wait_for_port's closes at once): seen twice
            assert time.monotonic() < deadline, "the launcher never connected to the emulator"
            first = _tcp(stack.launcher.pid, stack.port, "01")
            time.sleep(0.5)
            held = first & _tcp(stack.launcher.pid, stack.port, "01")
        os.kill(emulator.pid, signal.SIGKILL)
        try:
            code = stack.launcher.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail("make dev kept running without its emulator:\n" + stack.log.read_text(errors="replace")[-3000:])
        stack.seen = [*stack.seen, *_tree(stack.launcher.pid)]
        left, in_groups = stack.left_behind()
        assert not left and not in_groups, (left, in_groups)
        text = stack.log.read_text(errors="replace")
        said = (f"the emulated MongoDB on {local_stack.emulator_uri(stack.port)} exited with code -9 before "
                f"`dagster dev` started (its log: {tmp_path / 'home' / 'emulator.log'}): stopping make dev")
        assert code == 1 and said in text, text[-3000:]
        assert "Traceback" not in text and len(text.strip().splitlines()) == 1, text[-3000:]
        assert not any(PARTS["dagster dev"] in p.command for p in stack.seen)
