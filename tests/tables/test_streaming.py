"""Kafka topics -> Structured Streaming (foreachBatch) -> the same changelog and current_state tables."""

from __future__ import annotations

import random
from pathlib import Path

import mongomock
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from mongocdc_core.tables import TableLocations, read_changelog, reconcile
from mongocdc_core.tables.streaming import StreamSettings, start_stream

from .workload import DB, Workload, converter, slice_records, snapshot_records


def test_stream_from_kafka_builds_current_state(spark: SparkSession, tmp_path: Path, kafka_bootstrap: str) -> None:
    wl = Workload(random.Random(5), collections=("orders",), full_document=False)
    conv = converter("change_streams")  # no full documents: update descriptions are applied
    wl.run(5)
    records = snapshot_records(conv, wl, "orders")
    start = len(wl.events)
    wl.run(80)
    records += slice_records(conv, wl.events[start:])
    topic = records[0].topic
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for rec in records:  # tombstones included: the stream must skip them
        producer.produce(topic, key=rec.key, value=rec.value)
    assert producer.flush(30) == 0

    tables = TableLocations(str(tmp_path / "tables"))
    settings = StreamSettings(
        bootstrap_servers=kafka_bootstrap, topics=[topic], changelog_location=tables.changelog,
        state_location=tables.current_state, checkpoint_location=str(tmp_path / "checkpoint"),
        available_now=True, max_offsets_per_trigger=len(records) // 2 + 1,
    )
    query = start_stream(spark, settings)
    query.awaitTermination(300)
    assert query.exception() is None

    expected: mongomock.MongoClient = mongomock.MongoClient()
    expected[DB]["orders"].insert_many([dict(d) for d in wl.docs["orders"].values()])
    result = reconcile(spark, tables.current_state, expected, [f"{DB}.orders"])
    assert result.matches, result
    assert read_changelog(spark, tables.changelog).count() == sum(1 for r in records if r.op is not None)
