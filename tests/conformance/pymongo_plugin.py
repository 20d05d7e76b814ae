"""A pytest plugin loaded into pymongo's own test run: records every test's outcome as JSON lines.

For a unified-format test skipped by its ``runOnRequirements`` it also records whether a real
MongoDB 7.0 single-member replica set (no auth, no CSFLE) would satisfy those requirements, so
the runner can tell "the real server skips it too" from "the emulator looks wrong to pymongo".
It is loaded with ``-p tests.conformance.pymongo_plugin`` and writes to ``$MONGOCDC_CONFORMANCE_OUT``.

Two adjustments keep the run about the server, not the machine it runs on: a client opened without
a host (``MongoClient()``, as a few of pymongo's tests do) reaches the deployment under test rather
than whatever holds port 27017, and the known not-applicable failures, each a 30-second server
selection timeout, are skipped with their reason instead of being waited for.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import pymongo
import pytest

from tests.conformance.not_applicable import known_failure

#: What a real single-member replica set of the emulated version answers to runOnRequirements.
REAL_VERSION = (7, 0, 14)
REAL_TOPOLOGY = "replicaset"
REAL_PARAMETERS: dict[str, Any] = {"enableTestCommands": True}

_requirements: list[tuple[list[Any], bool]] = []  # (runOnRequirements, satisfied) of the running test
_patched = False


def _version(text: str) -> tuple[int, ...]:
    parts = [int(p) for p in str(text).split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def real_requirement_problem(requirement: Mapping[str, Any]) -> str | None:
    """Why a real 7.0 single-member replica set fails one requirement (None: it satisfies it)."""
    topologies = requirement.get("topologies")
    if topologies and REAL_TOPOLOGY not in topologies:
        return f"needs topology {'/'.join(topologies)}"
    low = requirement.get("minServerVersion")
    if low and _version(low) > REAL_VERSION:
        return f"needs server >= {low}"
    high = requirement.get("maxServerVersion")
    if high and _version(high) < REAL_VERSION:
        return f"needs server <= {high}"
    for name, value in (requirement.get("serverParameters") or {}).items():
        if REAL_PARAMETERS.get(name, object()) != value:
            return f"needs server parameter {name}={value}"
    if requirement.get("auth") is True:
        return "needs authentication enabled"
    if requirement.get("csfle"):
        return "needs client-side field level encryption (pymongocrypt)"
    if requirement.get("serverless") == "require":
        return "needs a serverless deployment"
    return None


def real_skip_reason(specs: Sequence[Any]) -> str | None:
    """The reason a real replica set also skips (None: a real one would run the test)."""
    if not specs:
        return None
    problems = [real_requirement_problem(req) for req in specs]
    if any(problem is None for problem in problems):
        return None
    return "; ".join(sorted({p for p in problems if p}))


def _patch_unified_runner() -> None:
    """Record the runOnRequirements the unified runner evaluates (file level, then test level)."""
    global _patched
    module = sys.modules.get("test.unified_format")
    if _patched or module is None:
        return
    mixin = module.UnifiedSpecTestMixinV1
    original = mixin.should_run_on

    def should_run_on(run_on_spec: list[Any]) -> bool:
        satisfied = bool(original(run_on_spec))
        _requirements.append((list(run_on_spec or ()), satisfied))
        return satisfied

    mixin.should_run_on = staticmethod(should_run_on)
    _patched = True


def _write(record: dict[str, Any]) -> None:
    path = os.environ.get("MONGOCDC_CONFORMANCE_OUT")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    """Point the clients' default address at the deployment pymongo's run was given (DB_IP, DB_PORT)."""
    host, port = os.environ.get("DB_IP"), os.environ.get("DB_PORT")
    for client in (pymongo.MongoClient, pymongo.AsyncMongoClient):
        if host:
            client.HOST = host
        if port:
            client.PORT = int(port)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the failures known not to apply: they fail on a real single-member replica set too."""
    for item in items:
        if (reason := known_failure(item.nodeid)) is not None:
            item.add_marker(pytest.mark.skip(reason=f"not applicable: {reason}"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _patch_unified_runner()
    _requirements.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    xfail = hasattr(report, "wasxfail")
    failed_phase = report.failed and not xfail
    skipped = report.skipped
    if not (failed_phase or skipped or (report.when == "call" and report.passed)):
        return
    record: dict[str, Any] = {"nodeid": item.nodeid, "when": report.when}
    if xfail:
        record["outcome"] = "xfailed" if skipped else "xpassed"
    elif skipped:
        record["outcome"] = "skipped"
        longrepr = report.longrepr
        record["reason"] = str(longrepr[2]) if isinstance(longrepr, tuple) else str(longrepr)
        unsatisfied = [spec for spec, ok in _requirements if not ok]
        if "runOnRequirements not satisfied" in record["reason"] and unsatisfied:
            record["real_skip"] = real_skip_reason(unsatisfied[-1])
    elif failed_phase:
        record["outcome"] = "failed"
        message = getattr(call.excinfo, "value", None) if call.excinfo else None
        record["message"] = f"{type(message).__name__}: {message}"[:400] if message is not None else report.longreprtext[-400:]
    else:
        record["outcome"] = "passed"
    _write(record)
