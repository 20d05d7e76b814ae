"""The dispatcher's durability rule: an offset is stored only after its records were flushed."""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from typing import Any

import bson
import orjson
import pytest
from bson import Binary, Int64, Timestamp
from bson.codec_options import DEFAULT_CODEC_OPTIONS

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.dispatcher import Dispatcher
from mongocdc_core.events import EventConverter, EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets import Offset
from mongocdc_core.positions import Position


class FlushFailed(RuntimeError):
    """The sink could not make its records durable."""


class LedgerSink:
    """Records what was written and what a flush made durable; can fail a chosen flush."""

    def __init__(self, fail_flush: int | None = None) -> None:
        self.written: list[Record] = []
        self.durable = 0  # how many of ``written`` a successful flush covered
        self.flushes = 0
        self.fail_flush = fail_flush

    def write(self, records: Sequence[Record]) -> None:
        self.written.extend(records)

    def flush(self, timeout: float | None = None) -> None:
        self.flushes += 1
        if self.flushes == self.fail_flush:
            raise FlushFailed(f"flush {self.flushes} failed")
        self.durable = len(self.written)

    def close(self) -> None:
        """Nothing to release."""

    def durable_positions(self) -> list[Position]:
        """Positions of the flushed records (data events and heartbeats)."""
        return [r.position for r in self.written[: self.durable]]


class CheckingStore:
    """An offset store that checks, at every save, that nothing ahead of the flushed records is saved."""

    def __init__(self, sink: LedgerSink) -> None:
        self.sink = sink
        self.saved: list[Offset] = []

    def load(self) -> Offset | None:
        return self.saved[-1] if self.saved else None

    def save(self, offset: Offset) -> None:
        assert self.sink.durable == len(self.sink.written), "offset saved while records were not flushed"
        durable = self.sink.durable_positions()
        if offset.position is not None and durable:
            assert offset.position <= max(durable), "offset ahead of the flushed records"
        self.saved.append(Offset.from_json(offset.to_json()))

    def close(self) -> None:
        """Nothing to release."""


def _config(**props: str) -> ConnectorConfig:
    base = {
        "mongodb.connection.string": "mongodb://127.0.0.1:1/?replicaSet=rs0",
        "topic.prefix": "srv",
        "max.batch.size": "3",
        "mongocdc.schemas.enable": "false",
    }
    return ConnectorConfig.from_dict({**base, **props})


def _token(ts: Timestamp) -> dict[str, Any]:
    """A resume token whose ``_data`` starts with the clusterTime, as the server's do."""
    return {"_data": f"82{ts.time:08X}{ts.inc:08X}2B0229296E04"}


def _insert(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    ts = Timestamp(1_700_000_000, i)
    token = _token(ts)
    doc: dict[str, Any] = {
        "_id": token,
        "operationType": "insert",
        "clusterTime": ts,
        "wallTime": datetime.datetime(2023, 11, 14, tzinfo=datetime.UTC),
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": i},
        "fullDocument": {"_id": i, "n": i},
    }
    return doc, token


def _dispatcher(sink: LedgerSink, store: CheckingStore, cfg: ConnectorConfig) -> Dispatcher:
    converter = EventConverter(EventOptions.from_config(cfg, rs="rs0"))
    return Dispatcher(cfg, converter, sink, store, ConnectorMetrics("srv"), Offset(), flush_interval_s=0)


def test_offsets_are_saved_only_after_their_records_were_flushed() -> None:
    sink = LedgerSink()
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config())
    for i in range(1, 11):
        dispatcher.change(*_insert(i))
        if i % 4 == 0:
            dispatcher.maybe_commit()  # interval 0: every call commits
    dispatcher.finish()
    assert len(store.saved) == 3 and sink.flushes == 3
    last = store.saved[-1].position
    assert last is not None and last == max(sink.durable_positions())
    assert last.increment == 10


def test_metrics_count_events_per_batch_and_name_the_last_events_own_position_and_token() -> None:
    """Metrics are reported once per drain, and what they name is the last counted event, even when a
    progress token (or a filtered event) moved the offset on after it."""
    sink = LedgerSink()
    dispatcher = _dispatcher(sink, CheckingStore(sink), _config(**{"max.batch.size": "100"}))
    dispatcher.change(*_insert(1))
    dispatcher.change(*_insert(2))
    streaming = dispatcher.metrics.streaming
    assert streaming.TotalNumberOfEventsSeen == 0  # not reported yet: once per batch
    dispatcher.progress_token(_token(Timestamp(1_700_000_000, 5)))
    dispatcher.drain()
    assert streaming.TotalNumberOfEventsSeen == 2 and streaming.TotalNumberOfCreateEventsSeen == 2
    assert streaming.SourceEventPosition == {"position": str(Position(1_700_000_000, 2)),
                                             "resume_token": str(_token(Timestamp(1_700_000_000, 2)))}
    assert streaming.MilliSecondsBehindSource >= 0


def test_a_failed_flush_saves_no_offset() -> None:
    sink = LedgerSink(fail_flush=2)
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config())
    for i in range(1, 5):
        dispatcher.change(*_insert(i))
    dispatcher.commit()  # flush 1 succeeds: offset at event 4
    for i in range(5, 9):
        dispatcher.change(*_insert(i))
    with pytest.raises(FlushFailed):
        dispatcher.commit()  # flush 2 fails: events 5..8 are not durable
    assert [o.position.increment for o in store.saved if o.position is not None] == [4]
    assert sink.durable_positions()[-1].increment == 4


def test_a_heartbeat_moves_the_offset_only_with_a_flush() -> None:
    sink = LedgerSink()
    store = CheckingStore(sink)
    cfg = _config(**{"heartbeat.interval.ms": "1"})
    dispatcher = _dispatcher(sink, store, cfg)
    dispatcher.change(*_insert(1))
    dispatcher.commit()
    dispatcher.progress_token(_token(Timestamp(1_700_000_050, 1)))  # the stream scanned further
    time.sleep(0.01)  # heartbeat.interval.ms=1 has passed
    dispatcher.heartbeat_if_due()
    assert store.saved[-1].position == Position(1_700_000_000, 1)  # not saved before the flush
    dispatcher.commit()
    assert store.saved[-1].position == Position(1_700_000_050, 1)


@pytest.mark.parametrize("event_format", ["change_streams", "debezium_3x"])
def test_a_transaction_ends_as_soon_as_the_stream_scanned_past_it(event_format: str) -> None:
    """END is written once the post-batch resume token passes the transaction, not at the next event."""
    sink = LedgerSink()
    cfg = _config(**{"provide.transaction.metadata": "true", "mongocdc.event.format": event_format})
    dispatcher = _dispatcher(sink, CheckingStore(sink), cfg)
    lsid = {"id": Binary(bytes(16), 4), "uid": Binary(bytes(32), 0)}
    for _ in range(2):
        doc, token = _insert(5)
        dispatcher.change({**doc, "lsid": lsid, "txnNumber": Int64(1)}, token)
    dispatcher.progress_token(_token(Timestamp(1_700_000_000, 5)))  # the batch ended inside the transaction
    dispatcher.drain()
    assert [r.topic for r in sink.written] == ["srv.transaction", "srv.shop.orders", "srv.shop.orders"]
    dispatcher.progress_token(_token(Timestamp(1_700_000_000, 6)))  # scanned past it: no event of it can follow
    dispatcher.drain()
    assert sink.written[-1].topic == "srv.transaction" and b'"END"' in (sink.written[-1].value or b"")
    dispatcher.change(*_insert(7))
    dispatcher.finish()
    assert sum(b'"END"' in (r.value or b"") for r in sink.written) == 1
    assert dispatcher.metrics.streaming.NumberOfCommittedTransactions == 1
# -- event.processing.failure.handling.mode ---------------------------------------------------------------


def _broken_insert(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """An insert the converter cannot turn into a record (no fullDocument)."""
    doc, token = _insert(i)
    del doc["fullDocument"]
    return doc, token


def test_fail_mode_names_the_unprocessable_event_and_keeps_the_offset_before_it() -> None:
    from mongocdc_core.failures import EventProcessingError

    sink = LedgerSink()
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config())
    for i in range(1, 5):
        dispatcher.change(*_insert(i))
    with pytest.raises(EventProcessingError) as info:
        dispatcher.change(*_broken_insert(5))
    dispatcher.commit()  # what the pipeline does after a failure: keep what was delivered
    text = str(info.value)
    assert "shop.orders" in text and "key 5" in text and "Timestamp(1700000000, 5)" in text
    assert "event.processing.failure.handling.mode=warn" in text and "\n" not in text
    assert store.saved[-1].position == Position(1_700_000_000, 4, 0)  # a restart reaches the event again


@pytest.mark.parametrize("mode", ["warn", "skip"])
def test_warn_and_skip_modes_skip_the_unprocessable_event_and_go_on(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    sink = LedgerSink()
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config(**{"event.processing.failure.handling.mode": mode}))
    with caplog.at_level("DEBUG", logger="mongocdc.failures"):
        for i in range(1, 7):
            dispatcher.change(*(_broken_insert(i) if i == 3 else _insert(i)))
        dispatcher.finish()
    assert [r.key for r in sink.written] == [b'{"id":"%d"}' % i for i in (1, 2, 4, 5, 6)]
    assert store.saved[-1].position == Position(1_700_000_000, 6, 0)
    assert dispatcher.metrics.streaming.NumberOfErroneousEvents == 1
    assert dispatcher.metrics.streaming.NumberOfEventsFiltered == 0
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    if mode == "warn":
        (warning,) = warnings
        assert "shop.orders" in warning.getMessage() and "key 3" in warning.getMessage()
    else:
        assert warnings == [] and any("key 3" in r.getMessage() for r in caplog.records)


def _raw(doc: dict[str, Any], replace: tuple[bytes, bytes] | None = None) -> Any:
    """The event as the change stream hands it over (a RawChange), its bytes optionally patched."""
    from mongocdc_core.events.raw import RawChange

    data = bson.encode(doc)
    if replace is not None:
        data = data.replace(*replace)
    return RawChange(data, DEFAULT_CODEC_OPTIONS.with_options(document_class=RawChange))


@pytest.mark.parametrize("mode", ["fail", "skip"])
def test_a_raw_event_that_does_not_decode_is_one_unprocessable_event(mode: str) -> None:
    """Invalid UTF-8 in a stored document (MongoDB keeps what it was given): the compiled path leaves
    it to Python, whose decoding fails; the failure policy names the event from its header."""
    from mongocdc_core.failures import EventProcessingError

    sink = LedgerSink()
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config(**{"event.processing.failure.handling.mode": mode}))
    for i in (1, 2):
        doc, token = _insert(i)
        dispatcher.change(_raw(doc), token)
    doc, token = _insert(3)
    doc["fullDocument"]["n"] = "AZ"
    broken = _raw(doc, (b"AZ", b"\xff\xfe"))
    assert broken.header is not None
    if mode == "fail":
        with pytest.raises(EventProcessingError) as info:
            dispatcher.change(broken, token)
        assert "insert" in str(info.value) and "shop.orders" in str(info.value) and "utf-8" in str(info.value)
        return
    assert dispatcher.change(broken, token) is False
    doc, token = _insert(4)
    dispatcher.change(_raw(doc), token)
    dispatcher.finish()
    assert [r.key for r in sink.written] == [b'{"id":"%d"}' % i for i in (1, 2, 4)]
    assert store.saved[-1].position == Position(1_700_000_000, 4, 0)


@pytest.mark.parametrize("event_format", ["change_streams", "debezium_3x", "oplog_1x"])
@pytest.mark.parametrize("as_raw", [False, True])
def test_the_last_transaction_id_metric_is_the_id_the_records_carry(event_format: str, as_raw: bool) -> None:
    """``LastTransactionId`` is the transaction's id as the format writes it in its BEGIN/END records and data
    records' ``transaction`` block (Debezium 3.x: ``<lsid as JSON>:<txnNumber>``, as the connector's
    ``MongoDbEventMetadataProvider`` reports it), the same whether the event is converted raw or decoded."""
    sink = LedgerSink()
    cfg = _config(**{"provide.transaction.metadata": "true", "mongocdc.event.format": event_format})
    dispatcher = _dispatcher(sink, CheckingStore(sink), cfg)
    lsid = {"id": Binary(bytes(range(16)), 4), "uid": Binary(bytes(32), 0)}
    for i in (1, 2):
        doc, token = _insert(i)
        event = {**doc, "lsid": lsid, "txnNumber": Int64(9)}
        dispatcher.change(_raw(event) if as_raw else event, token)
    dispatcher.finish()
    begin = orjson.loads(sink.written[0].value or b"")
    data = [orjson.loads(r.value or b"") for r in sink.written if r.topic == "srv.shop.orders"]
    assert begin["status"] == "BEGIN" and len(data) == 2
    ids = {begin["id"], *(value["transaction"]["id"] for value in data)}
    assert ids == {dispatcher.metrics.streaming.LastTransactionId}
    if event_format == "debezium_3x":
        assert begin["id"] == f"{data[0]['source']['lsid']}:9"


class RefusingSink(LedgerSink):
    """Refuses (``RecordRejected``) every record whose key is in ``refuse``, as Kafka refuses an oversized one."""

    def __init__(self, refuse: set[bytes]) -> None:
        super().__init__()
        self.refuse = refuse

    def write(self, records: Sequence[Record]) -> None:
        from mongocdc_core.sinks.base import RecordRejected

        for index, record in enumerate(records):
            if record.key in self.refuse:
                raise RecordRejected("the record is larger than the topic takes", record, index)
            self.written.append(record)


def test_fail_mode_stops_at_a_refused_record_and_never_saves_an_offset_past_it() -> None:
    from mongocdc_core.failures import EventProcessingError

    sink = RefusingSink({b'{"id":"5"}'})
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config())  # max.batch.size=3: 5 is in the second batch
    for i in range(1, 5):
        dispatcher.change(*_insert(i))
    dispatcher.commit()
    with pytest.raises(EventProcessingError) as info:
        for i in range(5, 9):
            dispatcher.change(*_insert(i))
        dispatcher.commit()
    dispatcher.commit()  # the pipeline's commit after a failure
    text = str(info.value)
    assert "cannot deliver the change event of shop.orders" in text and '{"id":"5"}' in text
    assert "larger than the topic takes" in text and "event.processing.failure.handling.mode" in text
    assert store.saved[-1].position == Position(1_700_000_000, 4, 0)


def test_warn_mode_skips_a_refused_record_and_delivers_the_rest_of_its_batch() -> None:
    sink = RefusingSink({b'{"id":"5"}'})
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config(**{"event.processing.failure.handling.mode": "warn"}))
    for i in range(1, 10):
        dispatcher.change(*_insert(i))
    dispatcher.finish()
    assert [r.key for r in sink.written] == [b'{"id":"%d"}' % i for i in (1, 2, 3, 4, 6, 7, 8, 9)]
    assert store.saved[-1].position == Position(1_700_000_000, 9, 0)
    assert dispatcher.metrics.streaming.NumberOfErroneousEvents == 1


@pytest.mark.parametrize("mode", ["fail", "warn"])
def test_a_snapshot_read_that_cannot_be_converted_goes_to_the_policy(mode: str) -> None:
    from mongocdc_core.failures import EventProcessingError
    from mongocdc_core.offsets import SnapshotState
    from mongocdc_core.receiver import SnapshotChunk

    sink = LedgerSink()
    store = CheckingStore(sink)
    dispatcher = _dispatcher(sink, store, _config(**{"event.processing.failure.handling.mode": mode}))
    start = Position(1_700_000_000, 1)
    dispatcher.snapshot_started(SnapshotState(["shop.orders"], start_position=start), {"shop.orders": 3})
    chunk = SnapshotChunk("shop.orders", [{"_id": 1}, {"no_id": True}, {"_id": 3}], ["first", "true", "last"], True)
    read_at = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    if mode == "fail":
        with pytest.raises(EventProcessingError, match="cannot process the snapshot read of shop.orders"):
            dispatcher.snapshot_chunk(chunk, start, read_at)
        assert sink.written == []
    else:
        dispatcher.snapshot_chunk(chunk, start, read_at)
        assert [r.key for r in sink.written] == [b'{"id":"1"}', b'{"id":"3"}']
        assert dispatcher.metrics.snapshot.NumberOfErroneousEvents == 1


def test_a_raw_chunk_reaches_the_sink_as_one_run_in_order_and_a_refused_read_in_it_is_skipped() -> None:
    """A snapshot chunk of inner reads goes to the sink as the converter's RecordRun, between the
    records buffered before and after it (delivery order kept); in warn mode a read the sink refuses
    in the middle of the run is skipped and the rest of the run is delivered."""
    from mongocdc_core.events.raw import RawDocuments
    from mongocdc_core.events.records import RecordRun
    from mongocdc_core.offsets import SnapshotState
    from mongocdc_core.receiver import SnapshotChunk

    class Batches(RefusingSink):
        def __init__(self, refuse: set[bytes]) -> None:
            super().__init__(refuse)
            self.batches: list[type] = []

        def write(self, records: Sequence[Record]) -> None:
            self.batches.append(type(records))
            super().write(records)

    sink = Batches({b'{"id":"12"}'})
    store = CheckingStore(sink)
    cfg = _config(**{"event.processing.failure.handling.mode": "warn", "max.batch.size": "100"})
    dispatcher = _dispatcher(sink, store, cfg)
    start = Position(1_700_000_000, 1)
    dispatcher.snapshot_started(SnapshotState(["shop.orders"], start_position=start), {"shop.orders": 30})
    dispatcher.change(*_insert(1))
    raw = RawDocuments(b"".join(bson.encode({"_id": i, "n": i}) for i in range(10, 20)), DEFAULT_CODEC_OPTIONS)
    read_at = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    dispatcher.snapshot_chunk(SnapshotChunk("shop.orders", raw, ["true"] * 10, False), start, read_at)
    dispatcher.change(*_insert(2))
    dispatcher.finish()
    keys = [r.key for r in sink.written]
    assert keys == [b'{"id":"1"}', *[b'{"id":"%d"}' % i for i in range(10, 20) if i != 12], b'{"id":"2"}']
    assert sink.batches == [list, RecordRun, RecordRun, list]  # the run, then what followed the refused read


def test_an_incremental_chunk_read_before_a_loss_does_not_end_it() -> None:
    """An incremental snapshot's chunk is handed over when a stream event closes its window, long after
    its documents were read. The stream's reply carrying the close comes after the monitor counted the
    loss (its own answer is ignored), and the chunk's documents were asked for before it too: handing
    them over ends nothing, so the stream's next failed read is the same outage, one disconnect (an
    earlier version took the chunk as MongoDB answering again and counted two). A chunk asked for after
    the loss does end it."""
    from mongocdc_core.receiver import SnapshotChunk

    sink = LedgerSink()
    dispatcher = _dispatcher(sink, CheckingStore(sink), _config(**{"max.batch.size": "100"}))
    metrics = dispatcher.metrics
    read_at = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
    metrics.connection_restored(0)  # connected
    asked = metrics.losses  # the chunk's find and the stream's getMore are sent
    metrics.connection_lost()  # the driver's monitor sees the server go
    metrics.connection_restored(asked)  # the stream's late reply, which closes the window
    chunk = SnapshotChunk("shop.orders", [{"_id": 1}], ["incremental"], False, asked=asked)
    dispatcher.snapshot_chunk(chunk, Position(1_700_000_000, 1), read_at)
    metrics.connection_lost()  # the stream's next getMore fails: the same outage
    disconnects = metrics.streaming.NumberOfDisconnects + metrics.snapshot.NumberOfDisconnects
    assert (disconnects, len(sink.written)) == (1, 1)
    later = SnapshotChunk("shop.orders", [{"_id": 2}], ["incremental"], False, asked=metrics.losses)
    dispatcher.snapshot_chunk(later, Position(1_700_000_000, 2), read_at)
    metrics.connection_lost()
    assert metrics.streaming.NumberOfDisconnects + metrics.snapshot.NumberOfDisconnects == 2
