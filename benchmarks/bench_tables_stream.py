"""Kafka -> Structured Streaming -> tables: freshness at a steady write rate over 20 collections.

A writer produces change events (inserts, then updates with full documents) round-robin over 20
collections at a steady rate into the devstack's real Kafka broker, through mongocdc's own Kafka sink
(one topic per collection, the position header on every record). ``start_stream`` runs ONE query
subscribed to all of them by pattern; its micro-batches write each touched collection's changelog
and current_state.

Freshness of an event: its Kafka timestamp (the producer's create time) to the commit time of the
first current_state version whose recorded position (``mongocdc.position``) covers it. Both come
from facts: the timestamps from reading the topics back, the commit times and positions from each
table's Delta log (``commitInfo.timestamp``, the state a refresh records in its commit), never from sleeps.

Baseline, in the same process at the same rate: a hand-written Structured Streaming query of the
same topics appending the raw records to one Delta table (no per-collection tables, no
deduplication, no MERGE); a record's freshness is its Kafka timestamp to the commit time of the
Delta version that added its file. Both queries run with the default trigger (the next
micro-batch starts when the last one ends). Printed: p50, p95, p99 (no goal; the issue asks for the
figure).

Full size: 20 collections, 20 events/s for 60 s per query. ``MONGOCDC_BENCH_SMALL=1``: 3 collections,
3 events/s for 8 s per query (it proves the benchmark works; the figures mean nothing).
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from bson import Timestamp
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from benchmarks import harness
from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.positions import Position
from mongocdc_core.sinks.kafka import POSITION_HEADER, KafkaSink, KafkaSinkSettings
from mongocdc_core.tables import CollectionTables
from mongocdc_core.tables.changelog import POSITION_PROPERTY, recorded_state
from mongocdc_core.tables.session import spark_session
from mongocdc_core.tables.streaming import StreamSettings, start_stream
from mongocdc_devstack.kafka_broker import KafkaBroker

NAME = "tables_stream"
BASELINE = (
    "a hand-written Structured Streaming query of the same topics appending the raw Kafka records to one Delta "
    "table (no per-collection tables, deduplication or MERGE), same writer and rate, same Spark session"
)
DB = "bench"
KEYS = 25  # documents per collection: the first pass inserts them, later events update them
PATTERN = r"stream\.bench\..*"


class Events:
    """Change events, one at a time, round-robin over the collections: first an insert of each key, then
    updates (full document and update description); positions follow the wall clock and only grow."""

    def __init__(self, bootstrap: str, collections: int) -> None:
        self.collections = collections
        self.sink = KafkaSink(KafkaSinkSettings.from_config(bootstrap))
        self.converter = EventConverter(
            EventOptions(topic_prefix="stream", capture_mode="change_streams_update_full", rs="rs0")
        )
        self.n = 0
        self.last = Timestamp(0, 0)

    def write(self, count: int) -> None:
        """Produce the next ``count`` events and wait until Kafka acknowledged them."""
        for _ in range(count):
            n = self.n
            self.n += 1
            per_round = self.collections * KEYS
            coll, key, version = f"c{n % self.collections:02d}", (n // self.collections) % KEYS, n // per_round
            now = int(time.time())
            self.last = Timestamp(now, 1) if now > self.last.time else Timestamp(self.last.time, self.last.inc + 1)
            doc = {"_id": key, "name": f"{coll}-{key}", "version": version, "price": n / 7, "tags": ["a", "b"]}
            change: dict[str, Any] = {
                "operationType": "insert" if version == 0 else "update", "ns": {"db": DB, "coll": coll},
                "documentKey": {"_id": key}, "clusterTime": self.last, "fullDocument": doc,
            }  # fmt: skip
            if version:
                change["updateDescription"] = {"updatedFields": {"version": version, "price": n / 7},
                                               "removedFields": [], "truncatedArrays": []}  # fmt: skip
            self.sink.write(self.converter.convert_change(change, Position.from_timestamp(self.last)))
        self.sink.flush()

    def close(self) -> None:
        self.sink.close()


class Writer(threading.Thread):
    """Writes one event every ``1 / rate`` seconds for ``seconds`` (on schedule: a late event does not
    push the later ones back)."""

    def __init__(self, events: Events, rate: float, seconds: float) -> None:
        super().__init__(name="bench-writer", daemon=True)
        self.events, self.rate, self.seconds = events, rate, seconds
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            started = time.monotonic()
            due = started
            while due - started < self.seconds:
                self.events.write(1)
                due += 1 / self.rate
                time.sleep(max(0.0, due - time.monotonic()))
        except BaseException as exc:  # reported by the caller
            self.error = exc


def _produced(bootstrap: str, since_ms: int) -> list[tuple[str, str, int]]:
    """(topic, position, Kafka timestamp in ms) of every record produced at or after ``since_ms``."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-reader", "enable.auto.commit": False})
    topics = [t for t in consumer.list_topics(timeout=30).topics if t.startswith(f"stream.{DB}.")]
    ends = {}
    assigned = []
    for topic in topics:
        for partition in consumer.list_topics(topic, timeout=30).topics[topic].partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)
            ends[(topic, partition)] = high
            assigned.append(TopicPartition(topic, partition, 0))
    consumer.assign(assigned)
    left = {k for k, high in ends.items() if high > 0}
    out: list[tuple[str, str, int]] = []
    while left:
        msg = consumer.poll(10)
        if msg is None:
            raise RuntimeError(f"topics not read to their end: {sorted(left)}")
        if msg.error():
            raise RuntimeError(str(msg.error()))
        topic, partition, offset = msg.topic() or "", msg.partition() or 0, msg.offset() or 0
        if offset + 1 >= ends[(topic, partition)]:
            left.discard((topic, partition))
        headers = dict(msg.headers() or [])
        stamp = msg.timestamp()[1]
        if stamp >= since_ms and POSITION_HEADER in headers:
            value = headers[POSITION_HEADER]
            out.append((topic, value.decode() if isinstance(value, bytes) else str(value), stamp))
    consumer.close()
    return out


def _commits(location: str) -> list[tuple[int, int, str | None, list[str]]]:
    """(version, commit time in ms, position recorded by then, files added) of each commit in the Delta log."""
    out = []
    position: str | None = None
    for path in sorted(Path(location, "_delta_log").glob("*.json")):
        stamp, added = 0, []
        text = path.read_text()
        for line in text.splitlines():
            action = orjson.loads(line)
            if "commitInfo" in action:
                stamp = int(action["commitInfo"]["timestamp"])
            elif "metaData" in action:  # tables written before the state went with the commit
                position = action["metaData"].get("configuration", {}).get(POSITION_PROPERTY, position)
            elif "add" in action:
                added.append(action["add"]["path"])
        position = (recorded_state(text, int(path.stem)) or {}).get(POSITION_PROPERTY, position)
        out.append((int(path.stem), stamp, position, added))
    return out


def _percentiles(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    if not ordered:
        raise RuntimeError("no event was measured")

    def at(p: float) -> float:
        return ordered[min(len(ordered) - 1, math.ceil(p * len(ordered)) - 1)]

    return at(0.50), at(0.95), at(0.99)


def _tables_freshness(root: Path, produced: list[tuple[str, str, int]]) -> list[float]:
    """Seconds from each event's Kafka timestamp to the current_state commit that covers its position."""
    commits: dict[str, list[tuple[int, int, str | None, list[str]]]] = {}
    out = []
    for topic, position, stamp in produced:
        namespace = topic.split(".", 1)[1]
        if namespace not in commits:
            commits[namespace] = _commits(CollectionTables.under(str(root), namespace).current_state)
        covering = next((c for c in commits[namespace] if c[2] is not None and c[2] >= position), None)
        if covering is None:
            raise RuntimeError(f"{namespace}: no current_state version covers position {position}")
        out.append((covering[1] - stamp) / 1000)
    return out


def _plain_freshness(spark: SparkSession, location: str, since_ms: int) -> list[float]:
    """Seconds from each record's Kafka timestamp to the commit of the Delta version that added its file."""
    added = {name: stamp for _, stamp, _, files in _commits(location) for name in files}
    rows = (spark.read.format("delta").load(location).where(F.col("timestamp") >= F.timestamp_millis(F.lit(since_ms)))
            .select(F.unix_millis("timestamp").alias("ms"), F.col("_metadata.file_name").alias("file"))
            .collect())  # fmt: skip
    return [(added[r["file"]] - r["ms"]) / 1000 for r in rows]


def _steady(events: Events, rate: float, seconds: float, query: StreamingQuery) -> int:
    """Run the writer for ``seconds``, then let ``query`` process everything; when the writer began (ms)."""
    since_ms = int(time.time() * 1000)
    writer = Writer(events, rate, seconds)
    writer.start()
    while writer.is_alive():
        writer.join(1)
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
    if writer.error is not None:
        raise writer.error
    query.processAllAvailable()
    query.stop()
    return since_ms


def _measured(name: str, values: tuple[float, float, float], base: tuple[float, float, float], rate: float,
              collections: int) -> list[harness.Row]:  # fmt: skip
    line = "the plain append stream's "
    return [
        harness.Row(NAME, f"{name} p{p}: event in Kafka -> visible in current_state, {collections} collections, "
                    f"{rate:g} events/s, one query", line + f"p{p}", v, b, "s", v / max(b, 0.001))
        for p, v, b in zip((50, 95, 99), values, base, strict=True)
    ]


def run(small: bool) -> list[harness.Row]:
    collections, rate, seconds = (3, 3.0, 8.0) if small else (20, 20.0, 60.0)
    spark = spark_session("local[2]", app_name="mongocdc-bench-tables-stream")
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-stream-") as tmp:
        work = Path(tmp)
        with KafkaBroker(None, work / "broker") as broker:
            bootstrap = broker.bootstrap_servers
            # every collection's first documents, so the timed window refreshes tables that exist (not first builds)
            events = Events(bootstrap, collections)
            events.write(collections * KEYS)
            plain = str(work / "plain")
            baseline_query = (
                spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
                .option("subscribePattern", PATTERN).option("startingOffsets", "earliest").load()
                .select("topic", "partition", "offset", "timestamp", F.col("value").cast("string").alias("value"))
                .writeStream.format("delta").option("checkpointLocation", str(work / "plain-checkpoint")).start(plain)
            )  # fmt: skip
            baseline_query.processAllAvailable()
            since = _steady(events, rate, seconds, baseline_query)
            base = _percentiles(_plain_freshness(spark, plain, since))

            root = work / "tables"
            settings = StreamSettings(bootstrap_servers=bootstrap, topics=[PATTERN], pattern=True, root=str(root),
                                      checkpoint_location=str(work / "checkpoint"))  # fmt: skip
            query = start_stream(spark, settings)
            query.processAllAvailable()
            since = _steady(events, rate, seconds, query)
            tables = _percentiles(_tables_freshness(root, _produced(bootstrap, since)))
            events.close()
    spark.stop()
    return _measured("Kafka -> tables freshness", tables, base, rate, collections)


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
