"""The jsonl and parquet sinks: layout, order, tombstones, atomic single-file output."""

from __future__ import annotations

import gzip
from array import array
from itertools import accumulate
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
import zstandard

from mongocdc_core.events.records import Record, RecordRun
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import SinkError
from mongocdc_core.sinks.factory import open_sink
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.sinks.parquet import LANDING_SCHEMA, ParquetSink

TOPIC = "shop.inventory.orders"


def _records() -> list[Record]:
    pos = Position(1700000000, 3)
    source = {"db": "inventory", "collection": "orders", "snapshot": "false", "ord": 3}
    create = {"op": "c", "ts_ms": 5, "after": '{"_id": 1, "a": 1}', "source": source}
    update = {
        "op": "u",
        "ts_ms": 6,
        "updateDescription": {"updatedFields": '{"a": 2}', "removedFields": ["b"], "truncatedArrays": None},
        "source": source,
    }
    delete = {"op": "d", "ts_ms": 7, "before": None, "source": source}
    key = orjson.dumps({"id": "1"})
    return [
        Record(TOPIC, key, orjson.dumps(create), pos, "inventory.orders", "c"),
        Record(TOPIC, key, orjson.dumps({"schema": {}, "payload": update}), Position(1700000000, 4), "inventory.orders", "u"),
        Record(TOPIC, key, orjson.dumps(delete), Position(1700000000, 5), "inventory.orders", "d"),
        Record(TOPIC, key, None, Position(1700000000, 5), "inventory.orders", "d"),
        Record("shop.transaction", b'{"id":"t"}', b'{"status":"BEGIN"}', pos, None, None),
    ]


def test_jsonl_writes_one_file_per_topic_in_order(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    sink.write(_records())
    sink.close()
    lines = (tmp_path / f"{TOPIC}.jsonl").read_bytes().splitlines()
    parsed = [orjson.loads(line) for line in lines]
    assert [p["value"] and (p["value"].get("op") or p["value"]["payload"]["op"]) for p in parsed] == ["c", "u", "d", None]
    assert parsed[-1] == {"key": {"id": "1"}, "value": None}
    assert (tmp_path / "shop.transaction.jsonl").exists()


def test_jsonl_appends_across_sinks_and_rejects_after_close(tmp_path: Path) -> None:
    for _ in range(2):
        sink = JsonlSink(tmp_path)
        sink.write(_records()[:1])
        sink.close()
    assert len((tmp_path / f"{TOPIC}.jsonl").read_bytes().splitlines()) == 2
    with pytest.raises(SinkError, match="closed"):
        sink.write(_records())


def test_jsonl_writes_a_record_run_as_the_lines_of_its_records(tmp_path: Path) -> None:
    """A snapshot chunk's RecordRun (keys and values end to end) lands as the same bytes as its records."""
    keys = [b'{"id":"%d"}' % i for i in range(5)]
    values = [b'{"after":"{\\"_id\\": %d}","op":"r"}' % i for i in range(5)]
    run = RecordRun(TOPIC, b"".join(keys), array("Q", accumulate(map(len, keys))).tobytes(), b"".join(values),
                    array("Q", accumulate(map(len, values))).tobytes(), Position(5, 1), "inventory.customers", "r")
    by_run, by_list = JsonlSink(tmp_path / "run"), JsonlSink(tmp_path / "list")
    by_run.write(run[1:])
    by_list.write(list(run)[1:])
    for sink in (by_run, by_list):
        sink.close()
    lines = (tmp_path / "run" / f"{TOPIC}.jsonl").read_bytes()
    assert lines == (tmp_path / "list" / f"{TOPIC}.jsonl").read_bytes()
    assert [orjson.loads(line)["key"] for line in lines.splitlines()] == [{"id": str(i)} for i in range(1, 5)]


def test_parquet_writes_a_record_run_as_the_rows_of_its_records(tmp_path: Path) -> None:
    """A snapshot chunk's RecordRun lands as the same rows as its records, without a Record per read."""
    keys = [b'{"id":"%d"}' % i for i in range(5)]
    values = [b'{"after":"{\\"_id\\": %d}","source":{"snapshot":"true"},"op":"r","ts_ms":%d}' % (i, i) for i in range(5)]
    run = RecordRun(TOPIC, b"".join(keys), array("Q", accumulate(map(len, keys))).tobytes(), b"".join(values),
                    array("Q", accumulate(map(len, values))).tobytes(), Position(5, 1), "inventory.customers", "r")
    by_run, by_list = ParquetSink.to_file(tmp_path / "run.parquet"), ParquetSink.to_file(tmp_path / "list.parquet")
    by_run.write(run[1:])
    by_list.write(list(run)[1:])
    for sink in (by_run, by_list):
        sink.close()
    rows = pq.read_table(tmp_path / "run.parquet").to_pylist()
    assert rows == pq.read_table(tmp_path / "list.parquet").to_pylist()
    assert [(r["key"], r["after"], r["op"], r["ts_ms"], r["pos_increment"]) for r in rows] == [
        (f'{{"id":"{i}"}}', f'{{"_id": {i}}}', "r", i, 1) for i in range(1, 5)]


def test_jsonl_rejects_topic_that_is_not_a_file_name(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path)
    with pytest.raises(SinkError, match="file name"):
        sink.write([Record("a/b", None, None, Position(1, 1), None, None)])


def test_parquet_rolling_files_carry_landing_columns(tmp_path: Path) -> None:
    sink = ParquetSink(tmp_path)
    sink.write(_records())
    sink.flush()
    sink.write(_records()[:1])
    sink.close()
    files = sorted((tmp_path / TOPIC).glob("part-*.parquet"))
    assert len(files) == 2 and not list((tmp_path / TOPIC).glob(".*"))
    table = max((pq.read_table(f) for f in files), key=lambda t: t.num_rows)
    assert table.schema.equals(LANDING_SCHEMA)
    rows = table.to_pylist()
    assert [r["op"] for r in rows] == ["c", "u", "d", None]
    assert rows[0]["after"] == '{"_id": 1, "a": 1}' and rows[0]["key"] == '{"id":"1"}'
    assert rows[1]["updated_fields"] == '{"a": 2}' and rows[1]["removed_fields"] == ["b"]
    assert rows[1]["position"] == Position(1700000000, 4).to_str() and rows[1]["pos_increment"] == 4
    assert rows[3]["value"] is None and rows[2]["snapshot"] == "false"


@pytest.mark.parametrize("layout", ["rolling", "single"])
def test_parquet_footers_keep_the_statistics_the_tables_read_and_no_text_dictionaries(layout: str, tmp_path: Path) -> None:
    """Landing files keep min/max statistics for the columns read from footers (``position``, ``op`` and
    ``snapshot`` tell which files may repeat an event, ``collection`` which collection a file holds), and
    neither statistics nor a dictionary for a document's text, which only cost the write time."""
    sink = ParquetSink(tmp_path) if layout == "rolling" else ParquetSink.to_file(tmp_path / "one.parquet")
    sink.write(_records())
    sink.close()
    path = next((tmp_path / TOPIC).glob("part-*.parquet")) if layout == "rolling" else tmp_path / "one.parquet"
    meta = pq.read_metadata(path)
    group = meta.row_group(0)
    chunks = {meta.schema.column(i).name: group.column(i) for i in range(meta.num_columns)}
    for name in ("collection", "position", "op", "snapshot", "pos_seconds", "pos_increment", "pos_ordinal"):
        stats = chunks[name].statistics
        assert stats is not None and stats.has_min_max, name
    assert chunks["position"].statistics.min == Position(1700000000, 3).to_str()
    for name in ("key", "before", "after", "updated_fields", "source", "value"):
        assert chunks[name].statistics is None or not chunks[name].statistics.has_min_max, name
        # ``source`` keeps its dictionary: a snapshot chunk's reads share one source block
        assert name == "source" or not any("DICTIONARY" in encoding for encoding in chunks[name].encodings), name
    assert pq.read_table(path).to_pylist()[0]["after"] == '{"_id": 1, "a": 1}'


def test_parquet_single_file_is_replaced_atomically(tmp_path: Path) -> None:
    target = tmp_path / "part" / "window.parquet"
    first = ParquetSink.to_file(target)
    first.write(_records())
    first.close()
    assert pq.read_table(target).num_rows == 5
    second = ParquetSink.to_file(target)
    second.write(_records()[:2])
    assert pq.read_table(target).num_rows == 5  # the old file stays until the new one is complete
    second.close()
    assert pq.read_table(target).num_rows == 2
    failed = ParquetSink.to_file(target)
    failed.write(_records())
    failed.abort()
    assert pq.read_table(target).num_rows == 2 and len(list(target.parent.iterdir())) == 1


def test_parquet_single_file_without_records_is_empty_not_stale(tmp_path: Path) -> None:
    target = tmp_path / "w.parquet"
    sink = ParquetSink.to_file(target)
    sink.write(_records())
    sink.close()
    empty = ParquetSink.to_file(target)
    empty.close()
    assert pq.read_table(target).num_rows == 0


@pytest.mark.parametrize("spec", ["jsonl", "jsonl:", "s3:bucket", "kafkaa:1:2"])
def test_open_sink_rejects_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError, match="sink"):
        open_sink(spec)


def test_open_sink_opens_file_sinks(tmp_path: Path) -> None:
    assert isinstance(open_sink(f"jsonl:{tmp_path}/j"), JsonlSink)
    assert isinstance(open_sink(f"parquet:{tmp_path}/p"), ParquetSink)


def test_tee_sink_delivers_to_every_sink(tmp_path: Path) -> None:
    from mongocdc_core.sinks.tee import TeeSink

    tee = TeeSink([JsonlSink(tmp_path / "j"), ParquetSink(tmp_path / "p")])
    tee.write(_records())
    tee.close()
    assert len((tmp_path / "j" / f"{TOPIC}.jsonl").read_bytes().splitlines()) == 4
    assert sum(pq.read_table(f).num_rows for f in (tmp_path / "p" / TOPIC).glob("*.parquet")) == 4
    with pytest.raises(ValueError, match="at least one"):
        TeeSink([])


def _decompressed(path: Path, compression: str) -> bytes:
    if compression == "gzip":
        return gzip.decompress(path.read_bytes())
    with open(path, "rb") as fh:
        return zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True).read()


@pytest.mark.parametrize(("compression", "suffix"), [("gzip", ".jsonl.gz"), ("zstd", ".jsonl.zst")])
def test_compressed_jsonl_holds_the_same_lines(tmp_path: Path, compression: str, suffix: str) -> None:
    plain, packed = JsonlSink(tmp_path / "plain"), JsonlSink(tmp_path / "packed", compression=compression)
    for sink in (plain, packed):
        for _ in range(3):  # three flushes: three members/frames, read back as one stream
            sink.write(_records())
            sink.flush()
        sink.close()
    assert packed.path(TOPIC).name == TOPIC + suffix
    expected = (tmp_path / "plain" / f"{TOPIC}.jsonl").read_bytes()
    assert len(expected.splitlines()) == 12
    assert _decompressed(packed.path(TOPIC), compression) == expected
    assert packed.path(TOPIC).stat().st_size < len(expected)


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_compressed_jsonl_drops_a_torn_member_on_restart(tmp_path: Path, compression: str) -> None:
    sink = JsonlSink(tmp_path, compression=compression)
    sink.write(_records()[:2])
    sink.close()
    path = sink.path(TOPIC)
    whole = path.read_bytes()
    # kill -9 in the middle of a later member: half of a valid member is on disk.
    other = JsonlSink(tmp_path / "other", compression=compression)
    other.write(_records()[2:3])
    other.close()
    member = other.path(TOPIC).read_bytes()
    path.write_bytes(whole + member[: len(member) // 2])
    restarted = JsonlSink(tmp_path, compression=compression)
    restarted.write(_records()[2:3])
    restarted.close()
    lines = _decompressed(path, compression).splitlines()
    assert [orjson.loads(line)["value"] is not None for line in lines] == [True, True, True]
    assert path.read_bytes().startswith(whole)


def test_jsonl_compression_comes_from_the_config(tmp_path: Path) -> None:
    from mongocdc_core.config import ConnectorConfig

    cfg = ConnectorConfig.from_dict({"mongodb.connection.string": "mongodb://h/?replicaSet=rs0", "topic.prefix": "p",
                                     "mongocdc.jsonl.compression": "zstd"})  # fmt: skip
    sink = open_sink(f"jsonl:{tmp_path}", cfg)
    assert isinstance(sink, JsonlSink) and sink.compression == "zstd"
    with pytest.raises(SinkError, match="mongocdc.jsonl.compression"):
        JsonlSink(tmp_path, compression="lz4")


def test_parquet_rows_are_the_same_with_and_without_schemas(tmp_path: Path) -> None:
    from mongocdc_core.events.convert import EventConverter
    from mongocdc_core.events.options import EventOptions
    from tests.events.helpers import POSITION, insert, update

    tables = []
    for schemas in (True, False):
        conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", schemas_enable=schemas, now_ns=lambda: 7))
        records = [r for _ in range(3) for ev in (insert(), update()) for r in conv.convert_change(ev, POSITION)]
        sink = ParquetSink.to_file(tmp_path / f"{schemas}.parquet")
        sink.write(records)
        sink.close()
        tables.append(pq.read_table(tmp_path / f"{schemas}.parquet").to_pylist())
    with_schemas, without = tables
    assert with_schemas == without and len(without) == 6
    assert orjson.loads(without[1]["value"])["op"] == "u" and orjson.loads(without[1]["key"]) == {"id": '{"$numberLong" : "1004"}'}


def test_parquet_takes_the_1x_format_too(tmp_path: Path) -> None:
    from mongocdc_core.events.convert import EventConverter
    from mongocdc_core.events.options import EventOptions
    from tests.events.helpers import POSITION, insert, update

    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0", event_format="oplog_1x", now_ns=lambda: 7))
    records = conv.convert_change(insert(), POSITION) + conv.convert_change(update(), POSITION)
    sink = ParquetSink.to_file(tmp_path / "x.parquet")
    sink.write(records)
    sink.close()
    rows = pq.read_table(tmp_path / "x.parquet").to_pylist()
    assert [r["op"] for r in rows] == ["c", "u"] and [r["snapshot"] for r in rows] == ["false", "false"]
    assert rows[0]["after"] == orjson.loads(records[0].value or b"")["payload"]["after"]
    assert orjson.loads(rows[1]["source"])["ord"] == POSITION.increment


def test_parquet_takes_documents_larger_than_a_json_block(tmp_path: Path) -> None:
    from mongocdc_core.events.convert import EventConverter
    from mongocdc_core.events.options import EventOptions
    from tests.events.helpers import POSITION, insert

    conv = EventConverter(EventOptions(topic_prefix="p", rs="rs0"))
    big = {"_id": 1, "text": 'x"' * 1_500_000}  # 3 MB, and 6 MB once escaped inside the envelope
    records = conv.convert_change(insert({"_id": 0}), POSITION) + conv.convert_change(insert(big), POSITION)
    sink = ParquetSink.to_file(tmp_path / "x.parquet")
    sink.write(records)
    sink.close()
    rows = pq.read_table(tmp_path / "x.parquet").to_pylist()
    assert orjson.loads(rows[1]["after"])["text"] == big["text"] and len(rows) == 2


def test_parquet_cuts_each_records_own_payload_when_a_batch_mixes_topics_and_schemas(tmp_path: Path) -> None:
    """The payload is cut at the head its topic's first record showed; a record of the same topic
    with another schema part, another topic's records and tombstones in the same batch keep theirs."""
    source = {"db": "inventory", "collection": "orders", "snapshot": "true", "ord": 1}
    payloads = [{"after": f'{{"_id": {i}}}', "source": source, "op": "r", "ts_ms": i} for i in range(4)]
    schemas = [{"type": "struct", "name": "A"}, {"type": "struct", "name": "A"}, {"type": "struct", "name": "B"}, {}]
    records = []
    for i, (payload, schema) in enumerate(zip(payloads, schemas, strict=True)):
        key = orjson.dumps({"schema": schema, "payload": {"id": str(i)}})
        records.append(Record(TOPIC, key, orjson.dumps({"schema": schema, "payload": payload}),
                              Position(1700000000, i), "inventory.orders", "r"))  # fmt: skip
        records.append(Record("shop.other", key, orjson.dumps(payload), Position(1700000000, i), "inventory.other", "r"))
    records.append(Record(TOPIC, orjson.dumps({"id": "3"}), None, Position(1700000000, 3), "inventory.orders", "d"))
    sink = ParquetSink.to_file(tmp_path / "x.parquet")
    sink.write(records)
    sink.close()
    rows = pq.read_table(tmp_path / "x.parquet").to_pylist()
    assert [(r["topic"], r["pos_increment"]) for r in rows] == [(TOPIC, i) for i in (0, 1, 2, 3, 3)] + [
        ("shop.other", i) for i in range(4)
    ]
    for row, payload in zip(rows[:4] + rows[5:], payloads + payloads, strict=True):
        assert orjson.loads(row["value"]) == payload and row["after"] == payload["after"]
        assert orjson.loads(row["source"]) == source and row["snapshot"] == "true" and row["op"] == "r"
    assert [orjson.loads(r["key"]) for r in rows[:5]] == [{"id": str(i)} for i in (0, 1, 2, 3, 3)]
    assert rows[4]["value"] is None and rows[4]["op"] is None and rows[4]["source"] is None
