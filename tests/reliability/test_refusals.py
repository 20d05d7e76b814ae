"""Failures the user must act on, met at run time: one clear line and the documented exit code each.

Refused credentials (code 18) exit 4, MongoDB unreachable once the reconnection attempts and
restarts are used up exits 3, a non-resumable change stream error (280 ChangeStreamFatalError) exits
6, offsets recorded for another replica set exit 7. (History lost, 5, and an event that cannot be
delivered, 8, have trials of their own; invalid configurations, 2, are the bad-input corpus.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mongocdc_devstack.fixture import EmulatedReplicaSet, free_port
from tests.reliability.conftest import Source
from tests.reliability.harness import (
    Connector,
    Figures,
    cluster_time,
    connector_properties,
    stop_at_arg,
    write_config,
)

pytestmark = pytest.mark.reliability


def _run(tmp_path: Path, name: str, props: dict[str, Any], offsets: Path, stop: str | None) -> tuple[int, str]:
    connector = Connector(write_config(tmp_path / f"{name}.json", props), f"jsonl:{tmp_path / 'out'}",
                          str(offsets), tmp_path)
    code = connector.run(*(["--stop-at", stop] if stop else []), timeout=180)
    return code, " ".join(connector.output().split())


@pytest.mark.fault
def test_runtime_refusals_have_their_exit_codes(source: Source, tmp_path: Path,
                                                report: Callable[[Figures], None]) -> None:
    db = source.fresh_db()
    db.load.insert_one({"_id": 1})
    base = connector_properties(source.uri, db.name, **{"snapshot.mode": "no_data"})
    offsets = tmp_path / "offsets.json"
    seen: dict[str, int] = {}
    failures = []

    def check(case: str, code: int, expected: int, text: str, *needles: str) -> None:
        seen[case] = code
        if code != expected or "Traceback" in text or not all(n in text for n in needles):
            failures.append(f"{case}: exit {code} (expected {expected}): {text[-1500:]}")

    code, text = _run(tmp_path, "auth", {**base, "mongodb.user": "cdc", "mongodb.password": "wrong",
                                         "errors.max.retries": 0}, tmp_path / "o-auth.json", None)
    check("credentials refused", code, 4, text, "refused the credentials")

    port = free_port()
    code, text = _run(tmp_path, "down", {**base, "mongodb.connection.string": f"mongodb://127.0.0.1:{port}/?replicaSet=rs0",
                                         "connect.max.attempts": 2, "errors.max.retries": 0,
                                         "mongodb.server.selection.timeout.ms": 200}, tmp_path / "o-down.json", None)
    check("unreachable", code, 3, text, "unreachable after 2 reconnection attempts", f"127.0.0.1:{port}")

    assert _run(tmp_path, "pin", base, offsets, stop_at_arg(cluster_time(source.client)))[0] == 0
    db.load.insert_one({"_id": 2})
    source.client.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data={
        "failCommands": ["aggregate", "getMore"], "errorCode": 280, "errorLabels": []})
    try:
        code, text = _run(tmp_path, "fatal", base, offsets, stop_at_arg(cluster_time(source.client)))
    finally:
        source.client.admin.command("configureFailPoint", "failCommand", mode="off")
    check("getMore 280", code, 6, text, "280", "ChangeStreamFatalError")

    with EmulatedReplicaSet(replset="other", noop_interval=0.5) as other:
        code, text = _run(tmp_path, "other", {**base, "mongodb.connection.string": other.uri}, offsets, None)
    check("offsets of another replica set", code, 7, text, "mongodb.allow.offset.invalidation")

    report(Figures("run-time refusals: one line, documented exit code",
                   note=" ".join(f"{case.replace(' ', '-')}={code}" for case, code in seen.items())))
    source.client.drop_database(db.name)
    assert not failures, "\n".join(failures)
