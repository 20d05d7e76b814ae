"""Parsing signal documents: Debezium's execute-snapshot / stop-snapshot forms and malformed input."""

from __future__ import annotations

from typing import Any

import pytest
from bson import ObjectId
from hypothesis import given
from hypothesis import strategies as st

from mongocdc_dagster.settings import CdcSettings, Granularity, SettingsError
from mongocdc_dagster.snapshot_requests import SignalError, parse_signal


def test_execute_snapshot_with_regexes_quoted_names_and_conditions() -> None:
    oid = ObjectId()
    signal = parse_signal({"_id": oid, "type": "execute-snapshot", "data": {
        "data-collections": ["inv\\.cust.*", '"inv"."my.coll"'], "type": "BLOCKING",
        "additional-conditions": [{"data-collection": '"inv"."my.coll"', "filter": '{"a": {"$gt": 1}}'}]}})
    assert signal is not None and signal.signal_id == str(oid) and signal.snapshot_type == "blocking"
    assert signal.matching(["inv.customers", "inv.my.coll", "inv.myXcoll", "other.customers"]) == [
        "inv.customers", "inv.my.coll"]
    assert signal.condition_for("inv.my.coll") == '{"a": {"$gt": 1}}' and signal.condition_for("inv.customers") is None


def test_the_sensor_accepts_what_the_engine_accepts() -> None:
    signal = parse_signal({"_id": 2, "type": "execute-snapshot", "data": {
        "data-collections": ["INV.Orders"],
        "additional-conditions": [{"data-collection": "inv.orders", "filter": "status='open' AND qty>5"}]}})
    assert signal is not None and signal.matching(["inv.orders", "inv.other"]) == ["inv.orders"]
    assert signal.condition_for("inv.orders") == '{"$and": [{"status": "open"}, {"qty": {"$gt": 5}}]}'


def test_defaults_follow_debezium() -> None:
    signal = parse_signal({"_id": "s1", "type": "execute-snapshot", "data": '{"data-collections": ["a.b"]}'})
    assert signal is not None and signal.snapshot_type == "incremental"  # the documented default
    stop = parse_signal({"_id": 7, "type": "stop-snapshot", "data": {"type": "incremental"}})
    assert stop is not None and stop.matches("any.thing")  # no data-collections: the whole snapshot
    assert parse_signal({"_id": 8, "type": "log", "data": {"message": "x"}}) is None


@pytest.mark.parametrize(("doc", "message"), [
    ({"_id": 1, "type": 5}, "'type' must be a non-empty string"),
    ({"_id": 1, "type": "execute-snapshot", "data": []}, "'data' must be a JSON object"),
    ({"_id": 1, "type": "execute-snapshot", "data": "{oops"}, "not valid JSON"),
    ({"_id": 1, "type": "execute-snapshot", "data": {}}, "requires 'data-collections'"),
    ({"_id": 1, "type": "execute-snapshot", "data": {"data-collections": "a.b"}}, "must be an array of strings"),
    ({"_id": 1, "type": "execute-snapshot", "data": {"data-collections": ["["]}}, "not a valid regular expression"),
    ({"_id": 1, "type": "execute-snapshot", "data": {"data-collections": ["a.b"], "type": "full"}},
     "must be 'incremental' or 'blocking'"),
    ({"_id": 1, "type": "stop-snapshot", "data": {"data-collections": ["a.b"]}}, "requires data.type"),
    ({"_id": 1, "type": "execute-snapshot", "data": {"data-collections": ["a.b"], "additional-conditions": [
        {"data-collection": "a.b", "filter": "color='blue' OR size=2"}]}}, "cannot translate"),
    ({"_id": 1, "type": "execute-snapshot", "data": {"data-collections": []}}, "'data-collections' is empty"),
    ({"_id": 1, "type": "execute-snapshot", "data": {"data-collections": ["a.b"], "additional-conditions": [
        {"data-collection": "a.c", "filter": "{}"}]}}, "not in data-collections"),
])
def test_malformed_signals_name_the_problem(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(SignalError, match="signal 1") as info:
        parse_signal(doc)
    assert message in str(info.value)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                     max_leaves=8)


@given(st.fixed_dictionaries({"_id": st.integers(), "type": st.sampled_from(["execute-snapshot", "stop-snapshot"])},
                             optional={"data": _json}))
def test_any_document_parses_or_raises_signal_error(doc: dict[str, Any]) -> None:
    try:
        parse_signal(doc)
    except SignalError as exc:
        assert f"signal {doc['_id']}" in str(exc)


def test_settings_reject_bad_values_by_name() -> None:
    assert Granularity.parse("15min").cron == "*/15 * * * *"
    with pytest.raises(SettingsError, match="MONGOCDC_SLICE_GRANULARITY='7min'"):
        Granularity.parse("7min")
    with pytest.raises(SettingsError, match="MONGOCDC_SLICE_START"):
        CdcSettings.from_env({"MONGOCDC_SLICE_START": "yesterday"})
    with pytest.raises(SettingsError, match="MONGOCDC_SENSOR_INTERVAL"):
        CdcSettings.from_env({"MONGOCDC_SENSOR_INTERVAL": "0"})
