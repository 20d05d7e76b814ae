"""History loss per ``snapshot.mode``: the oplog is purged past the stored offset. Never a silent gap.

Changes made while the connector is away (5 deletes, 5 updates, 5 inserts) are purged from the oplog
before it comes back. Each mode either refuses loudly (exit code 5, the recovery explained) or takes a
new snapshot; a re-snapshot with ``mongocdc.snapshot.delete.missing.keys=true`` leaves no ghost. In the
"mid-stream" cases the purge happens while the running connector's ``getMore`` is blocked.

Figures: **lost** counts source documents whose state downstream is stale after a run that exited 0
(a silent gap); **state mismatch** counts ghosts (documents deleted in the source, still downstream).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.engine.engine_support import source_state
from tests.reliability.conftest import Source
from tests.reliability.harness import (
    FULL,
    Connector,
    Figures,
    JsonlWatcher,
    cluster_time,
    connector_properties,
    read_jsonl,
    stop_at_arg,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.reliability, pytest.mark.fault]

CB = "snapshot.mode.configuration.based."
REFUSES, RESNAPSHOTS, COMPLETE = "refuses", "re-snapshots", "complete"
# (case, properties, expected outcome, part of the small run)
CASES: list[tuple[str, dict[str, Any], str, bool]] = [
    ("initial", {"snapshot.mode": "initial"}, REFUSES, True),
    ("initial_only", {"snapshot.mode": "initial_only"}, COMPLETE, True),
    ("no_data", {"snapshot.mode": "no_data"}, REFUSES, False),
    ("never", {"snapshot.mode": "never"}, REFUSES, False),
    ("when_needed + delete.missing.keys", {"snapshot.mode": "when_needed",
                                           "mongocdc.snapshot.delete.missing.keys": "true"}, RESNAPSHOTS, True),
    ("when_needed", {"snapshot.mode": "when_needed"}, RESNAPSHOTS, False),
    ("always + delete.missing.keys", {"snapshot.mode": "always",
                                      "mongocdc.snapshot.delete.missing.keys": "true"}, RESNAPSHOTS, False),
    ("always", {"snapshot.mode": "always"}, RESNAPSHOTS, False),
    # snapshot.data=false: only the data error can make these snapshot (snapshot.data=true would be "always").
    ("configuration_based, snapshot.on.data.error + delete.missing.keys", {
        "snapshot.mode": "configuration_based", CB + "start.stream": "true", CB + "snapshot.on.data.error": "true",
        "mongocdc.snapshot.delete.missing.keys": "true"}, RESNAPSHOTS, False),
    ("configuration_based, no snapshot.on.data.error", {
        "snapshot.mode": "configuration_based", CB + "start.stream": "true"}, REFUSES, False),
]
MID_STREAM: list[tuple[str, dict[str, Any], str, bool]] = [
    ("mid-stream: initial", {"snapshot.mode": "initial"}, REFUSES, False),
    ("mid-stream: when_needed + delete.missing.keys", {"snapshot.mode": "when_needed",
                                                       "mongocdc.snapshot.delete.missing.keys": "true"},
     RESNAPSHOTS, False),
]


def _changes_while_away(db: Any) -> None:
    db.load.delete_many({"_id": {"$in": [0, 3, 6, 9, 12]}})
    for i in (1, 4, 7, 10, 13):
        db.load.update_one({"_id": i}, {"$set": {"changed": True}})
    db.load.insert_many([{"_id": 100 + i} for i in range(5)])


def _purge(source: Source) -> None:
    source.client.admin.command("mongocdcTruncateOplog", before=cluster_time(source.client))


def _by_id(docs: list[str]) -> dict[str, str]:
    return {orjson.dumps(orjson.loads(d)["_id"]).decode(): d for d in docs}


def _figures(case: str, code: int, expected: str, rebuilt: list[str], source: list[str], rss: float) -> Figures:
    down, up = _by_id(rebuilt), _by_id(source)
    stale = sum(1 for key, doc in up.items() if down.get(key) != doc)
    ghosts = sum(1 for key in down if key not in up)
    silent = code == 0 and expected != COMPLETE
    return Figures(f"history lost: {case}", lost=stale if silent else 0, mismatch=ghosts if silent else 0,
                   peak_rss_mb=rss, note=f"exit={code} ({expected})")


def _run_case(source: Source, tmp_path: Path, case: str, props: dict[str, Any], expected: str,
              mid_stream: bool) -> tuple[Figures, Connector, int]:
    db = source.fresh_db()
    db.load.insert_many([{"_id": i, "n": i} for i in range(30)])
    out = tmp_path / "out"
    landing = out / f"rel.{db.name}.load.jsonl"
    config = write_config(tmp_path / "connector.json", connector_properties(source.uri, db.name, **props))
    connector = Connector(config, f"jsonl:{out}", str(tmp_path / "offsets.json"), tmp_path)
    assert connector.run("--stop-at", stop_at_arg(cluster_time(source.client))) == 0, connector.tail()
    if not mid_stream:
        _changes_while_away(db)
        _purge(source)
        code = connector.run("--stop-at", stop_at_arg(cluster_time(source.client)))
    else:
        # The restarted stream's first command blocks (long enough for the writes and the purge even on
        # a loaded machine); meanwhile the changes are made and purged. A marker written after the purge
        # tells when a connector that carries on has caught up.
        source.client.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data={
            "failCommands": ["aggregate", "getMore"], "blockConnection": True, "blockTimeMS": 15_000})
        connector.start()
        connector.wait_streaming()
        _changes_while_away(db)
        _purge(source)
        db.marker.insert_one({"_id": "caught-up"})
        watcher = JsonlWatcher(out / f"rel.{db.name}.marker.jsonl")
        wait_until(lambda: not connector.running() or watcher.delivered("caught-up"), 300,
                   f"{case}: the connector failed or caught up")
        code = connector.terminate() if connector.running() else connector.wait()
    delivered = read_jsonl(landing)
    figures = _figures(case, code, expected, delivered.rebuilt(f"{db.name}.load"), source_state(db.load),
                       connector.peak_rss_mb)
    source.client.admin.command("configureFailPoint", "failCommand", mode="off")
    source.client.drop_database(db.name)
    return figures, connector, code


@pytest.mark.parametrize(
    ("case", "props", "expected", "mid_stream"),
    [(c, p, e, False) for c, p, e, small in CASES if small or FULL]
    + [(c, p, e, True) for c, p, e, small in MID_STREAM if small or FULL],
    ids=[c for c, _, _, small in CASES if small or FULL] + [c for c, _, _, small in MID_STREAM if small or FULL],
)
def test_history_lost(source: Source, tmp_path: Path, case: str, props: dict[str, Any], expected: str,
                      mid_stream: bool, report: Callable[[Figures], None]) -> None:
    figures, connector, code = _run_case(source, tmp_path, case, props, expected, mid_stream)
    report(figures)
    output = " ".join(connector.output().split())
    assert "Traceback" not in output
    if expected == REFUSES:
        assert code == 5 and "no longer in the oplog" in output and "when_needed" in output, connector.tail()
    elif expected == COMPLETE:
        assert code == 0 and "snapshot already complete" in output, connector.tail()
    else:
        assert code == 0, connector.tail()
        assert figures.lost == 0, figures.line()  # never a silent gap
        if props.get("mongocdc.snapshot.delete.missing.keys") == "true":
            assert figures.mismatch == 0, figures.line()  # no ghosts
        else:
            assert figures.mismatch == 5, figures.line()  # the documented ghosts without the property
