"""Dates Python's datetime cannot hold (beyond year 9999, before year 1) are carried, not fatal.

MongoDB stores a date as 64-bit milliseconds since the epoch; decoding them into ``datetime`` fails
with ``InvalidBSON: year 146140482 is out of range``, which made every snapshot and every restart
of the stream crash on the same document. They are spelled ``{"$date": <millis>}`` as every other
date, in records with and without schemas and in the 1.x format, and as keys.
"""

from __future__ import annotations

import datetime
from typing import Any

import orjson
import pytest
from bson.datetime_ms import DatetimeMS

from mongocdc_core.offsets import MemoryOffsetStore
from tests.engine.engine_support import MemorySink, make_config, run_engine

FAR_FUTURE = 2**62  # year 146140482
BEFORE_YEAR_ONE = -62_135_596_800_001  # one millisecond before 0001-01-01T00:00:00Z
IN_RANGE = datetime.datetime(2024, 5, 1, 12, 0, tzinfo=datetime.UTC)
IN_RANGE_MS = 1_714_564_800_000


def _documents() -> list[dict[str, Any]]:
    return [
        {"_id": 1, "at": DatetimeMS(FAR_FUTURE), "also": IN_RANGE},
        {"_id": 2, "at": DatetimeMS(BEFORE_YEAR_ONE), "nested": {"list": [DatetimeMS(FAR_FUTURE)]}},
        {"_id": DatetimeMS(FAR_FUTURE), "at": DatetimeMS(-(2**62))},
    ]


def _expected_after() -> dict[str, str]:
    return {
        "1": f'{{"_id": 1,"at": {{"$date": {FAR_FUTURE}}},"also": {{"$date": {IN_RANGE_MS}}}}}',
        "2": f'{{"_id": 2,"at": {{"$date": {BEFORE_YEAR_ONE}}},"nested": {{"list": [{{"$date": {FAR_FUTURE}}}]}}}}',
        f'{{"$date" : {FAR_FUTURE}}}': f'{{"_id": {{"$date": {FAR_FUTURE}}},"at": {{"$date": {-(2**62)}}}}}',
    }


def _afters(sink: MemorySink) -> dict[str, str]:
    out = {}
    for record in sink.data():
        if record.value is None:
            continue
        key, value = orjson.loads(record.key or b"null"), orjson.loads(record.value)
        key, value = key.get("payload", key), value.get("payload", value)
        out[key["id"]] = value["after"]
    return out


@pytest.mark.parametrize("schemas", ["true", "false"])
def test_snapshot_carries_dates_outside_pythons_range(fresh_db: Any, mongo_uri: str, schemas: str) -> None:
    fresh_db.d.insert_many(_documents())
    cfg = make_config(mongo_uri, fresh_db.name, **{"mongocdc.schemas.enable": schemas})
    offsets = MemoryOffsetStore()
    sink = MemorySink()
    summary = run_engine(cfg, sink, offsets)
    assert summary.snapshot_documents == 3
    assert _afters(sink) == _expected_after()
    # A restart resumes from the saved offset instead of crashing on the same document again.
    again = MemorySink()
    run_engine(cfg, again, offsets)
    assert again.data() == []


def test_streaming_carries_dates_outside_pythons_range(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data"})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)  # pins the start
    fresh_db.d.insert_many(_documents())
    fresh_db.d.update_one({"_id": 1}, {"$set": {"when": DatetimeMS(BEFORE_YEAR_ONE)}})
    sink = MemorySink()
    run_engine(cfg, sink, offsets)
    values = sink.values()
    assert [v["op"] for v in values] == ["c", "c", "c", "u"]
    afters = _afters(sink)
    assert afters["1"] == (
        f'{{"_id": 1,"at": {{"$date": {FAR_FUTURE}}},"also": {{"$date": {IN_RANGE_MS}}},'
        f'"when": {{"$date": {BEFORE_YEAR_ONE}}}}}'
    )
    assert afters["2"] == _expected_after()["2"]
    assert values[3]["updateDescription"]["updatedFields"] == f'{{"when": {{"$date": {BEFORE_YEAR_ONE}}}}}'


def test_legacy_format_carries_dates_outside_pythons_range(fresh_db: Any, mongo_uri: str) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data", "mongocdc.event.format": "oplog_1x"})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.d.insert_one({"_id": 1, "at": DatetimeMS(FAR_FUTURE)})
    fresh_db.d.update_one({"_id": 1}, {"$set": {"at": DatetimeMS(BEFORE_YEAR_ONE)}})
    sink = MemorySink()
    run_engine(cfg, sink, offsets)
    insert, update = sink.values()
    assert insert["after"] == f'{{"_id" : 1,"at" : {{"$date" : {FAR_FUTURE}}}}}'
    assert update["patch"] == f'{{"$set":{{"at":{{"$date":{BEFORE_YEAR_ONE}}}}}}}'
