"""The compiled walk of record payloads (``mongocdc_native.landing_columns``) gives exactly the landing
columns Arrow's JSON reader gives, and takes the records the connector writes."""

from __future__ import annotations

from typing import Any

import mongocdc_native
import orjson
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks import parquet
from mongocdc_core.sinks.parquet import landing_table
from tests.events.helpers import POSITION, change, insert, update

TOPIC = "p.inventory.orders"


def _both(records: list[Record], monkeypatch: pytest.MonkeyPatch) -> tuple[pa.Table, pa.Table]:
    """The landing table with the compiled walk, and with Arrow's reader alone."""
    walked = landing_table(records)
    with monkeypatch.context() as patch:
        patch.setattr(parquet, "native", None)
        read = landing_table(records)
    return walked, read


def test_the_walk_takes_the_connectors_records_and_gives_the_readers_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    for schemas in (True, False):
        conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", schemas_enable=schemas, now_ns=lambda: 7,
                                           capture_mode="change_streams_update_full_with_pre_image"))  # fmt: skip
        doc = {"_id": 1, "name": 'a "quoted"\\ name\n\t\x01', "emoji": "\U0001f600 é", "n": [1, {"x": None}]}
        shrunk = {"updatedFields": {"n": [1]}, "removedFields": ["old"], "truncatedArrays": [{"field": "n", "newSize": 1}]}
        events = [insert(doc), update(), update(updateDescription=shrunk), change("delete")]
        records = [r for ev in events for r in conv.convert_change(ev, POSITION)]
        values = [r.value for r in records]
        keys = [r.key for r in records]
        payloads = parquet._PayloadText()
        value_head = payloads.head(records[0].topic, False, values)
        key_head = payloads.head(records[0].topic, True, keys)
        assert (value_head is not None) == schemas
        assert mongocdc_native.landing_columns(keys, key_head, values, value_head) is not None
        walked, read = _both(records, monkeypatch)
        assert walked.equals(read)
        assert orjson.loads(walked.column("after")[0].as_py()) == {
            "_id": 1, "name": doc["name"], "emoji": doc["emoji"], "n": [1, {"x": None}]}  # fmt: skip


def test_the_walk_leaves_what_it_does_not_take_to_the_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated members, an escaped member name, a 1.x boolean snapshot, a fraction in ts_ms, a lone
    surrogate: the walk refuses the batch and the reader's columns are written."""
    base = b'"source":{"snapshot":"false"},"op":"c","ts_ms":5'
    for value in (
        b'{"after":"{}","after":"{\\"a\\": 1}",' + base + b"}",
        b'{"\\u0061fter":"{}",' + base + b"}",
        b'{"after":"{}","source":{"snapshot":true},"op":"c","ts_ms":5}',
        b'{"after":"{}","source":{"snapshot":"false"},"op":"c","ts_ms":5.0}',
        b'{"after":"\\ud800",' + base + b"}",
    ):
        records = [Record(TOPIC, b'{"id":"1"}', value, Position(1, 1), "inventory.orders", "c")]
        assert mongocdc_native.landing_columns([b'{"id":"1"}'], None, [value], None) is None
        try:
            walked, read = _both(records, monkeypatch)
        except (pa.ArrowInvalid, orjson.JSONDecodeError):
            continue  # the reader refuses it too (the lone surrogate): the sink reports it either way
        assert walked.equals(read)


_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_json_text = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
).map(lambda value: orjson.dumps(value).decode())
_truncated = st.lists(
    st.none() | st.fixed_dictionaries({"field": _text, "size": st.integers(0, 99)}, optional={"extra": st.booleans()}),
    max_size=2,
)
_update = st.fixed_dictionaries(
    {},
    optional={
        "updatedFields": st.none() | _json_text,
        "removedFields": st.none() | st.lists(_text, max_size=3),
        "truncatedArrays": st.none() | _truncated,
        "other": _json_text,
    },
)
_payload = st.fixed_dictionaries(
    {},
    optional={
        "before": st.none() | _json_text,
        "after": st.none() | _json_text,
        "updateDescription": st.none() | _update,
        "source": st.none() | st.fixed_dictionaries({}, optional={"snapshot": st.none() | _text, "ord": st.integers(0, 9)}),
        "op": st.sampled_from(["c", "u", "d", "r"]),
        "ts_ms": st.none() | st.integers(-(2**62), 2**62),
        "transaction": st.none() | st.fixed_dictionaries({"id": _text}),
    },
)


def _record(payload: dict[str, Any] | None, schema: bool, spaced: bool) -> Record:
    value = None if payload is None else orjson.dumps({"schema": {"name": "A"}, "payload": payload} if schema else payload)
    if value is not None and spaced:
        value = value.replace(b'":', b'" : ', 1)  # blanks between tokens, as another writer may put them
    key = orjson.dumps({"schema": {"name": "K"}, "payload": {"id": "1"}} if schema else {"id": "1"})
    return Record(TOPIC, key, value, Position(1, 1), "inventory.orders", None if payload is None else payload.get("op"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(st.none() | _payload, st.booleans()), min_size=1, max_size=6), schema=st.booleans())
def test_the_walk_and_the_reader_give_the_same_columns(
    rows: list[tuple[dict[str, Any] | None, bool]], schema: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = [_record(payload, schema, spaced) for payload, spaced in rows]
    walked, read = _both(records, monkeypatch)
    assert walked.to_pylist() == read.to_pylist()
