"""Shows the conformance report at the end of a run (also under pytest-xdist, from the controller)."""

from __future__ import annotations

import time

import pytest

from tests.conformance import pymongo_suite

_STARTED = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    reports = sorted(pymongo_suite.CACHE.glob("report-*.txt")) if pymongo_suite.CACHE.exists() else []
    fresh = [path for path in reports if path.stat().st_mtime >= _STARTED]
    if fresh:
        terminalreporter.section("pymongo conformance")
        terminalreporter.write(fresh[-1].read_text())
