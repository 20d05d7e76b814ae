"""Oversize events: change events over MongoDB's 16 MiB limit, and records over Kafka's message size.

Over 16 MiB (pre- and post-image of a 9 MiB document): ``cursor.oversize.handling.mode`` splits them
(delivered whole), skips them (above ``cursor.oversize.skip.threshold``) or fails with advice. Over the
topic's ``max.message.bytes``: ``event.processing.failure.handling.mode`` skips the record with a
warning, or fails naming it (exit 8) — the same one line on every restart, never a crash loop.
The figures count as lost only events that were not meant to be skipped.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine.engine_support import source_state
from tests.reliability.conftest import Source
from tests.reliability.harness import (
    FULL,
    Connector,
    Delivered,
    Figures,
    cluster_time,
    compare,
    connector_properties,
    ground_truth,
    key_of,
    read_jsonl,
    stop_at_arg,
    write_config,
)

pytestmark = pytest.mark.reliability

BIG = 9 * 1024 * 1024


def _prepare(source: Source, tmp_path: Path, sink: str, props: dict[str, Any],
             blob: int) -> tuple[Any, Connector, Any]:
    """A connector streaming a collection with pre/post images; then small writes around one big update
    (and the cluster time before them)."""
    db = source.fresh_db()
    db.create_collection("load", changeStreamPreAndPostImages={"enabled": True})
    db.load.insert_one({"_id": "big", "blob": "x" * blob, "n": 0})
    config = write_config(tmp_path / f"connector-{uuid.uuid4().hex[:6]}.json", connector_properties(
        source.uri, db.name, **{"snapshot.mode": "no_data", "offset.flush.interval.ms": 0, **props}))
    connector = Connector(config, sink, str(tmp_path / "offsets.json"), tmp_path)
    start = cluster_time(source.client)
    assert connector.run("--stop-at", stop_at_arg(start)) == 0, connector.tail()
    db.load.insert_many([{"_id": i} for i in range(20)])
    db.load.update_one({"_id": "big"}, {"$set": {"n": 1}})
    db.load.insert_many([{"_id": i} for i in range(20, 40)])
    return db, connector, start


def _figures(name: str, db: Any, start: Any, stop: Any, delivered: Delivered, skipped: int,
             connector: Connector) -> Figures:
    truth = ground_truth(db, "load", start, stop)
    big = {identity for identity in truth if identity[2] == key_of("big")}
    for identity in big if skipped else ():
        del truth[identity]
    expected_state = source_state(db.load)
    rebuilt = delivered.rebuilt(f"{db.name}.load")
    if skipped:  # the skipped update is meant to be missing downstream
        expected_state = [d for d in expected_state if '"big"' not in d[:20]]
        rebuilt = [d for d in rebuilt if '"big"' not in d[:20]]
    figures = compare(name, truth, delivered.events(start, stop), rebuilt, expected_state,
                      peak_rss_mb=connector.peak_rss_mb)
    figures.note += f" skipped-on-purpose={len(big) if skipped else 0}"
    return figures


MONGO_CASES = [  # (mode, extra properties, expected exit, skipped on purpose)
    ("split", {}, 0, False),
    ("skip", {"cursor.oversize.skip.threshold": 1024 * 1024}, 0, True),
    ("fail", {}, 1, False),
]


@pytest.mark.skipif(not FULL, reason="make reliability only: tests/engine/test_oversize.py covers every mode in make test")
@pytest.mark.parametrize(("mode", "extra", "code", "skipped"), [(m, e, c, s) for m, e, c, s in MONGO_CASES],
                         ids=[m for m, *_ in MONGO_CASES])
def test_change_events_over_16_mib(source: Source, tmp_path: Path, mode: str, extra: dict[str, Any], code: int,
                                   skipped: bool, report: Callable[[Figures], None]) -> None:
    out = tmp_path / "out"
    db, connector, start = _prepare(source, tmp_path, f"jsonl:{out}", {
        "capture.mode": "change_streams_update_full_with_pre_image", "cursor.oversize.handling.mode": mode, **extra,
    }, BIG)
    stop = cluster_time(source.client)
    codes = [connector.run("--stop-at", stop_at_arg(stop)) for _ in range(2 if code else 1)]
    output = " ".join(connector.output().split())
    assert codes == [code] * len(codes) and "Traceback" not in output, connector.tail()
    if code:
        assert output.count("Set it to 'split'") == 2  # the same advice on every restart
        figures = Figures(f"event over 16 MiB: oversize mode {mode}", note=f"exit={code} twice, advice given",
                          peak_rss_mb=connector.peak_rss_mb)
    else:
        delivered = read_jsonl(out / f"rel.{db.name}.load.jsonl")
        figures = _figures(f"event over 16 MiB: oversize mode {mode}", db, start, stop, delivered, skipped, connector)
        assert figures.lost == 0 and figures.mismatch == 0, figures.line()
    report(figures)
    source.client.drop_database(db.name)


KAFKA_CASES = [("warn", 0, True, True), ("fail", 8, False, False)]


@pytest.mark.parametrize(("mode", "code", "skipped"), [(m, c, s) for m, c, s, small in KAFKA_CASES if small or FULL],
                         ids=[m for m, *_, small in KAFKA_CASES if small or FULL])
def test_records_over_kafkas_message_size(source: Source, tmp_path: Path, kafka_bootstrap: str, mode: str,
                                          code: int, skipped: bool, report: Callable[[Figures], None]) -> None:
    from tests.kafka.kafka_support import read_topic

    db, connector, start = _prepare(source, tmp_path, f"kafka:{kafka_bootstrap}", {
        "event.processing.failure.handling.mode": mode, "capture.mode": "change_streams_update_full",
    }, 1_500_000)
    stop = cluster_time(source.client)
    codes = [connector.run("--stop-at", stop_at_arg(stop)) for _ in range(2 if code else 1)]
    output = " ".join(connector.output().split())
    assert codes == [code] * len(codes) and "Traceback" not in output, connector.tail()
    topic = f"rel.{db.name}.load"
    delivered = Delivered([(k or b"null", v) for _, k, v in read_topic(kafka_bootstrap, topic)])
    if code:
        assert output.count(f"cannot deliver the change event of {db.name}.load") == 2
        assert "max.message.bytes" in output
        figures = Figures(f"record over Kafka's limit: mode {mode}", note=f"exit={code} twice, the event named",
                          peak_rss_mb=connector.peak_rss_mb)
    else:
        assert "skipping an event (event.processing.failure.handling.mode=warn)" in output
        figures = _figures(f"record over Kafka's limit: mode {mode}", db, start, stop, delivered, skipped, connector)
        assert figures.lost == 0 and figures.mismatch == 0, figures.line()
    report(figures)
    source.client.drop_database(db.name)
