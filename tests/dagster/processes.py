"""Waiting on and stopping the Dagster processes (webserver, daemon) the end-to-end tests start."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout: float, logs: list[Path]) -> T:
    """Poll `probe` until it returns something truthy; on timeout fail with the process logs' tails."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(1.0)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{tails}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Stop a process this test started, with the children it spawned (its own session)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
