"""Tests of pymongo's suite that a real MongoDB 7.0 single-member replica set skips or fails too.

They are left out of the applicable tests, each with its reason; everything else the emulator
does not pass counts against its pass rate, skips included.
"""

from __future__ import annotations

from pathlib import PurePosixPath

#: Skip messages a real single-member 7.0 replica set gets the same way (regex on the message).
REAL_SKIP_REASONS: tuple[tuple[str, str], ...] = (
    (r"Must be connected to a standalone", "needs a standalone mongod"),
    (r"Not enough secondaries available", "needs secondaries"),
    (r"does not support secondary read preference", "needs secondaries"),
    (r"Must have multiple mongoses available", "needs several mongos routers"),
    (r"Cluster type not in", "needs another topology"),
    (r"Server version must be at (most|least)", "needs another server version"),
    (r"This test only works with the asynchronous API", "asynchronous API only"),
    (r"cluster-level change streams cannot be invalidated", "not applicable to its stream type (pymongo)"),
    (r"PyMongo does not support", "an operation pymongo does not implement"),
    (r"Implement PYTHON-\d+", "pymongo has not implemented it yet"),
    (r"this test does not support load balancers", "needs a load balancer"),
    (r"This cluster supports retryable writes", "needs a deployment without retryable writes (standalone)"),
)

#: Failures a real single-member replica set without a secondary shows too: "file::Class::test" -> reason.
_SECONDARY_FIRST = ("pymongo selects a secondary before it refuses a transaction's non-primary read preference: "
                    "without a secondary, server selection times out instead")
NOT_APPLICABLE_FAILURES: dict[str, str] = {
    "test_transactions_unified::TestUnifiedRunCommand::test_run_command_fails_with_explicit_secondary_read_preference": _SECONDARY_FIRST,
    "test_transactions_unified::TestUnifiedRunCommand::test_run_command_fails_with_secondary_read_preference_from_transaction_options": _SECONDARY_FIRST,
    "test_transactions_unified::TestUnifiedReadPref::test_secondary_readPreference": _SECONDARY_FIRST,
}


def known_failure(nodeid: str) -> str | None:
    """Why a real single-member replica set fails the test of pymongo's suite ``nodeid`` too (None: not one of them)."""
    path, _, test = nodeid.partition("::")
    return NOT_APPLICABLE_FAILURES.get(f"{PurePosixPath(path).stem}::{test}")
