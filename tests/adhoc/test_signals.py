"""Signal parsing, filters, collection names, the processor and the file channel (no database)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId

from mongocdc_core.source.signals import (
    CHANNEL_FILE,
    CHANNEL_KAFKA,
    FileSignalChannel,
    LogNotifier,
    Signal,
    SignalError,
    SignalProcessor,
    collection_pattern,
    match_collections,
    parse_execute_snapshot,
    parse_filter,
    parse_signal_document,
    parse_signal_json,
    parse_stop_snapshot,
)

# -- documents and JSON ------------------------------------------------------------------------------------


def test_source_document_without_id_uses_the_generated_object_id() -> None:
    oid = ObjectId()
    signal = parse_signal_document(
        {"_id": oid, "type": "execute-snapshot",
         "data": {"data-collections": ['"public"."Collection1"'], "type": "incremental"}}
    )
    assert signal.id == str(oid)
    assert signal.type == "execute-snapshot"
    assert signal.data["data-collections"] == ['"public"."Collection1"']
    assert signal.channel == "source"


def test_source_document_with_explicit_id_and_data_as_json_text() -> None:
    signal = parse_signal_document({"_id": ObjectId(), "id": "ad-hoc-1", "type": "execute-snapshot",
                                    "data": '{"data-collections": ["db.a"]}'})
    assert signal.id == "ad-hoc-1"
    assert signal.data == {"data-collections": ["db.a"]}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"_id": 1, "data": {}}, "'type' must be a non-empty string"),
        ({"_id": 1, "type": "", "data": {}}, "'type' must be a non-empty string"),
        ({"_id": 1, "type": "execute-snapshot", "data": "{not json"}, "'data' is not valid JSON"),
        ({"_id": 1, "type": "execute-snapshot", "data": [1, 2]}, "'data' must be a JSON object"),
    ],
)
def test_malformed_documents_are_rejected_with_a_clear_message(document: dict[str, Any], message: str) -> None:
    with pytest.raises(SignalError, match=message):
        parse_signal_document(document)


def test_kafka_value_with_matching_key() -> None:
    value = b'{"type":"execute-snapshot","data": {"data-collections": ["schema1.table1"], "type": "INCREMENTAL"}}'
    signal = parse_signal_json(value, CHANNEL_KAFKA, key=b"test_connector", topic_prefix="test_connector", id="kafka-0-7")
    assert signal.id == "kafka-0-7"
    assert parse_execute_snapshot(signal).snapshot_type == "incremental"


def test_kafka_key_must_match_topic_prefix() -> None:
    with pytest.raises(SignalError, match="does not match topic.prefix"):
        parse_signal_json('{"type": "log", "data": {"message": "x"}}', CHANNEL_KAFKA, key="other", topic_prefix="srv")


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '"just a string"'])
def test_json_that_is_not_an_object_is_rejected(text: str) -> None:
    with pytest.raises(SignalError, match="file channel"):
        parse_signal_json(text, CHANNEL_FILE)


# -- collection names --------------------------------------------------------------------------------------


def test_quoted_names_match_dots_literally() -> None:
    pattern = collection_pattern('"public"."My.Collection"')
    assert pattern.fullmatch("public.My.Collection")
    assert not pattern.fullmatch("public.MyXCollection")


def test_regular_expressions_match_whole_names_ignoring_case() -> None:
    names = ["inv.orders", "inv.orders_archive", "inv.customers", "other.orders"]
    assert match_collections(["inv\\.orders"], names) == ["inv.orders"]
    assert match_collections(["INV\\..*"], names) == ["inv.orders", "inv.orders_archive", "inv.customers"]
    assert match_collections(["inv.orders", ".*\\.orders"], names) == ["inv.orders", "other.orders"]


@pytest.mark.parametrize("entry", ['"public"My', '"public".', "inv.(", ""])
def test_bad_collection_entries_are_rejected(entry: str) -> None:
    with pytest.raises(SignalError):
        collection_pattern(entry)


# -- filters -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ("color='blue'", {"color": "blue"}),
        ("color='blue' AND brand='MyBrand'", {"$and": [{"color": "blue"}, {"brand": "MyBrand"}]}),
        ("color = 'it''s' and qty >= 5", {"$and": [{"color": "it's"}, {"qty": {"$gte": 5}}]}),
        ("name='A AND B'", {"name": "A AND B"}),
        ("price < 2.5 AND active = true AND gone <> null",
         {"$and": [{"price": {"$lt": 2.5}}, {"active": True}, {"gone": {"$ne": None}}]}),
        ('"a.b" != "x"', {"a.b": {"$ne": "x"}}),
        ('{"color": {"$in": ["blue", "red"]}}', {"color": {"$in": ["blue", "red"]}}),
    ],
)
def test_filters_translate_to_query_documents(text: str, query: dict[str, Any]) -> None:
    assert parse_filter(text) == query


def test_a_query_document_is_taken_as_is() -> None:
    assert parse_filter({"qty": {"$gt": 1}}) == {"qty": {"$gt": 1}}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SELECT * FROM [schema1].[table1] WHERE column1 = 0", "SQL statement"),
        ("color='blue' OR color='red'", "cannot translate"),
        ("(color='blue')", "cannot translate"),
        ("color='blue", "unterminated"),
        ("qty = five", "is not a value"),
        ("", "non-empty string"),
        ("{bad json", "not a valid JSON query"),
    ],
)
def test_untranslatable_filters_are_rejected(text: str, message: str) -> None:
    with pytest.raises(SignalError, match=message):
        parse_filter(text)


# -- execute-snapshot / stop-snapshot ----------------------------------------------------------------------


def _signal(kind: str, data: dict[str, Any]) -> Signal:
    return Signal("s1", kind, data, "source")


def test_execute_snapshot_defaults_to_incremental_and_resolves_conditions() -> None:
    request = parse_execute_snapshot(_signal("execute-snapshot", {
        "data-collections": ["inv\\.products", "inv\\.orders"],
        "additional-conditions": [{"data-collection": "inv.products", "filter": "color='blue'"}],
    }))
    assert request.snapshot_type == "incremental"
    namespaces, filters = request.resolve(["inv.orders", "inv.products", "inv.other"])
    assert namespaces == ["inv.orders", "inv.products"]
    assert filters == {"inv.products": {"color": "blue"}}


def test_execute_snapshot_blocking_and_deprecated_additional_condition() -> None:
    request = parse_execute_snapshot(_signal("execute-snapshot", {
        "type": "BLOCKING", "data-collections": ["inv.a"], "additional-condition": "qty > 3",
    }))
    assert request.snapshot_type == "blocking"
    assert request.resolve(["inv.a"]) == (["inv.a"], {"inv.a": {"qty": {"$gt": 3}}})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "requires 'data-collections'"),
        ({"data-collections": "inv.a"}, "must be an array of strings"),
        ({"data-collections": ["inv.a"], "type": "full"}, "'incremental' or 'blocking'"),
        ({"data-collections": ["inv.a"], "additional-conditions": [{"filter": "a=1"}]}, "'data-collection' string"),
        ({"data-collections": ["inv.a"], "additional-conditions": [{"data-collection": "inv.a"}]}, "has no 'filter'"),
        ({"data-collections": ["inv.a"], "additional-conditions": [{"data-collection": "inv.a", "filter": "a=1 OR b=2"}]},
         "additional condition for 'inv.a'"),
    ],
)
def test_bad_execute_snapshot_signals(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SignalError, match=message):
        parse_execute_snapshot(_signal("execute-snapshot", data))


def test_stop_snapshot_requires_the_incremental_type() -> None:
    assert parse_stop_snapshot(_signal("stop-snapshot", {"type": "INCREMENTAL"})).collections is None
    some = parse_stop_snapshot(_signal("stop-snapshot", {"type": "incremental", "data-collections": ["inv.a"]}))
    assert some.collections == ("inv.a",)
    with pytest.raises(SignalError, match="requires data.type 'incremental'"):
        parse_stop_snapshot(_signal("stop-snapshot", {"data-collections": ["inv.a"]}))


# -- processor ---------------------------------------------------------------------------------------------


class FakeControl:
    """Records what the processor asks of the incremental snapshotter."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.running: list[str] = []
        self.paused = False

    def start(self, signal_id: str, namespaces: Sequence[str], filters: Mapping[str, dict[str, Any]]) -> None:
        self.calls.append(("start", signal_id, list(namespaces), dict(filters)))
        self.running = list(namespaces)

    def stop(self, namespaces: Sequence[str] | None) -> list[str]:
        self.calls.append(("stop", None if namespaces is None else list(namespaces)))
        return list(namespaces or self.running)

    def pause(self) -> bool:
        self.calls.append(("pause",))
        was, self.paused = self.paused, True
        return not was

    def resume(self) -> bool:
        self.calls.append(("resume",))
        was, self.paused = self.paused, False
        return was

    def collections(self) -> list[str]:
        return list(self.running)


def _processor(blocking: list[Any] | None = None) -> tuple[SignalProcessor, FakeControl, LogNotifier]:
    control = FakeControl()
    notifier = LogNotifier("srv")

    def run_blocking(signal_id: str, namespaces: list[str], filters: dict[str, dict[str, Any]]) -> None:
        assert blocking is not None
        blocking.append((signal_id, namespaces, filters))

    processor = SignalProcessor(control, notifier, lambda: ["inv.a", "inv.b", "inv.c"],
                                run_blocking if blocking is not None else None, connector_name="srv")
    return processor, control, notifier


def test_processor_runs_signals_in_order() -> None:
    processor, control, notifier = _processor()
    processor.receive_document({"_id": ObjectId(), "type": "execute-snapshot",
                                "data": {"data-collections": ["inv\\.[ab]"]}})
    processor.receive_json('{"id": "p", "type": "pause-snapshot"}', CHANNEL_FILE)
    processor.receive_json('{"id": "r", "type": "resume-snapshot"}', CHANNEL_KAFKA)
    processor.receive_json('{"id": "x", "type": "stop-snapshot", "data": {"type": "incremental", '
                           '"data-collections": ["inv.b"]}}', CHANNEL_FILE)
    processor.receive_json('{"id": "y", "type": "stop-snapshot", "data": {"type": "incremental"}}', CHANNEL_FILE)
    assert processor.process() == 5
    assert [c[0] for c in control.calls] == ["start", "pause", "resume", "stop", "stop"]
    assert control.calls[0][2:] == (["inv.a", "inv.b"], {})
    assert control.calls[3] == ("stop", ["inv.b"])
    assert control.calls[4] == ("stop", None)
    assert processor.rejected == 0 and notifier.sent == []


def test_empty_data_collections_is_rejected() -> None:
    processor, control, notifier = _processor()
    processor.receive_document({"_id": 1, "type": "execute-snapshot", "data": {"data-collections": []}})
    processor.process()
    assert control.calls == [] and processor.rejected == 1
    (sent,) = notifier.sent
    assert sent["type"] == "REJECTED" and "'data-collections' is empty" in sent["additional_data"]["reason"]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ('{"id": "u1", "type": "reboot-the-world", "data": {}}', "unknown signal type"),
        ('{"id": "u2", "type": "execute-snapshot", "data": {"data-collections": ["nomatch\\\\..*"]}}',
         "match no captured collection"),
        ('{"id": "u3", "type": "execute-snapshot", "data": {"data-collections": ["inv.a"], "type": "blocking"}}',
         "blocking snapshots are not available"),
        ("{garbage", "not valid JSON"),
        ('{"id": "u5", "type": "log"}', "log requires data.message"),
    ],
)
def test_bad_signals_are_notified_and_skipped(payload: str, reason: str) -> None:
    processor, control, notifier = _processor()
    processor.receive_json(payload, CHANNEL_FILE, id="file-line-1")
    processor.receive_json('{"id": "ok", "type": "execute-snapshot", "data": {"data-collections": ["inv.c"]}}',
                           CHANNEL_FILE)
    processor.process()
    assert processor.rejected == 1
    (sent,) = notifier.sent
    assert sent["aggregate_type"] == "Signal" and sent["type"] == "REJECTED"
    assert reason in sent["additional_data"]["reason"]
    assert sent["additional_data"]["channel"] == "file"
    assert control.calls == [("start", "ok", ["inv.c"], {})]  # the next signal still ran


def test_a_failing_action_is_reported_not_raised() -> None:
    processor, control, notifier = _processor()

    def explode(*args: Any) -> None:
        raise RuntimeError("database went away")

    control.start = explode  # type: ignore[method-assign,assignment]
    processor.submit(Signal("boom", "execute-snapshot", {"data-collections": ["inv.a"]}, "source"))
    processor.process()
    assert "database went away" in notifier.sent[0]["additional_data"]["reason"]


def test_blocking_requests_go_to_the_blocking_runner() -> None:
    blocking: list[Any] = []
    processor, control, _ = _processor(blocking)
    processor.submit(Signal("b1", "execute-snapshot", {
        "type": "blocking", "data-collections": ["inv.a", "inv.b"],
        "additional-conditions": [{"data-collection": "inv.b", "filter": {"qty": {"$gt": 0}}}],
    }, "kafka"))
    processor.process()
    assert blocking == [("b1", ["inv.a", "inv.b"], {"inv.b": {"qty": {"$gt": 0}}})]
    assert control.calls == []


# -- file channel ------------------------------------------------------------------------------------------


def test_file_channel_reads_each_line_once(tmp_path: Path) -> None:
    processor, control, notifier = _processor()
    path = tmp_path / "file-signals.txt"
    path.write_text(
        '{"id":"d139b9b7-7777-4547-917d-e1775ea61d41", "type":"execute-snapshot", '
        '"data":{"data-collections":["inv.a"], "type":"INCREMENTAL"}}\n'
        "\n"
        "this is not a signal\n"
    )
    channel = FileSignalChannel(path, 0.05, processor)
    assert channel.poll() == 2
    assert not path.exists()
    assert channel.poll() == 0  # nothing is read twice
    processor.process()
    assert control.calls == [("start", "d139b9b7-7777-4547-917d-e1775ea61d41", ["inv.a"], {})]
    assert processor.rejected == 1 and "file-file-signals.txt-3" == notifier.sent[0]["additional_data"]["signal_id"]


def test_file_channel_thread_polls_until_stopped(tmp_path: Path) -> None:
    processor, control, _ = _processor()
    path = tmp_path / "signals.txt"
    channel = FileSignalChannel(path, 0.02, processor)
    channel.start()
    try:
        partial = tmp_path / "partial"
        partial.write_text('{"id": "late", "type": "pause-snapshot"}')  # no newline: complete only when unchanged
        partial.rename(path)
        for _ in range(200):
            if processor.pending():
                break
            channel.join(0.02)
    finally:
        channel.stop()
        channel.join(5)
    assert not channel.is_alive()
    processor.process()
    assert control.calls == [("pause",)]


def test_file_channel_waits_for_an_incomplete_last_line(tmp_path: Path) -> None:
    processor, control, _ = _processor()
    path = tmp_path / "signals.txt"
    path.write_text('{"id": "a", "type": "pause-snapshot"}\n{"id": "b", "type": "resu')
    channel = FileSignalChannel(path, 1.0, processor)
    assert channel.poll() == 0  # a writer may still be appending
    with path.open("a") as fh:
        fh.write('me-snapshot"}\n')
    assert channel.poll() == 2
    processor.process()
    assert control.calls == [("pause",), ("resume",)]
