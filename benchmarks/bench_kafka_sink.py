"""Streaming into Kafka against the jsonl sink on the same workload, and source-to-ack latency.

Throughput: a connector pins its start point, then N documents are inserted (and half of them
updated) so the oplog holds the workload; the engine then streams those events from the same
stored offset twice, once into the jsonl sink (baseline, fsync at every commit) and once into a
real local Kafka broker (idempotent producer, acks=all). The ratio kafka/jsonl says what fraction
of the file sink's speed the Kafka sink keeps, independent of the machine.

Latency: with the Kafka connector streaming, documents are inserted at a steady rate; for each one
the time from ``insert_one`` returning to the broker acknowledging its record (delivery report,
served by a polling thread) is measured; p50 and p99 are printed.

Usage: ``python -m benchmarks.bench_kafka_sink`` (``MONGOCDC_BENCH_SMALL=1``: 1,000 documents)
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Message
from pymongo import MongoClient

from benchmarks import harness
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import FileOffsetStore
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.sinks.kafka import KafkaSink, KafkaSinkSettings
from mongocdc_devstack.fixture import EmulatedReplicaSet
from mongocdc_devstack.kafka_broker import KafkaBroker


def _config(uri: str, prefix: str) -> ConnectorConfig:
    return ConnectorConfig.from_dict(
        {
            "name": prefix,
            "mongodb.connection.string": uri,
            "topic.prefix": prefix,
            "collection.include.list": r"bench\..*",
            "snapshot.mode": "no_data",
            "poll.interval.ms": "20",
            "cursor.max.await.time.ms": "100",
            "offset.flush.interval.ms": "1000",
            "mongocdc.schemas.enable": "false",
        }
    )


def _stream(cfg: ConnectorConfig, sink: Any, offsets: Path, events: int) -> float:
    """Events/s streaming ``events`` change events from the stored offset into ``sink``."""
    start = time.perf_counter()
    summary = Engine(cfg, sink, FileOffsetStore(offsets)).run(max_events=events)
    sink.close()
    elapsed = time.perf_counter() - start
    assert summary.events == events, f"streamed {summary.events} of {events} events"
    return events / elapsed


def _throughput(uri: str, bootstrap: str, docs: int, work: Path) -> tuple[float, float]:
    client: MongoClient[Any] = MongoClient(uri)
    client.bench.t.drop()
    cfg = _config(uri, "tput")
    pinned = work / "pinned.json"
    Engine(cfg, JsonlSink(work / "pin"), FileOffsetStore(pinned)).run(until_idle=0.3)  # records the start
    for i in range(0, docs, 500):
        client.bench.t.insert_many([{"_id": j, "name": f"customer-{j}", "value": j, "tags": ["a", "b"]}
                                    for j in range(i, min(i + 500, docs))])
    for i in range(0, docs, 2):
        client.bench.t.update_one({"_id": i}, {"$set": {"value": -i - 1}})
    events = docs + (docs + 1) // 2
    copies = {name: work / f"{name}.json" for name in ("jsonl", "kafka")}
    for copy in copies.values():
        shutil.copy(pinned, copy)
    jsonl = _stream(cfg, JsonlSink(work / "jsonl"), copies["jsonl"], events)
    kafka = _stream(cfg, KafkaSink.from_config(bootstrap, cfg), copies["kafka"], events)
    client.close()
    return jsonl, kafka


def _latency(uri: str, bootstrap: str, count: int, work: Path) -> list[float]:
    """Milliseconds from insert to Kafka's acknowledgement, per document."""
    client: MongoClient[Any] = MongoClient(uri)
    client.bench.lat.drop()
    cfg = _config(uri, "lat")
    written: dict[int, float] = {}
    acked: dict[int, float] = {}

    def on_ack(msg: Message) -> None:
        key = msg.key()
        if key is not None and msg.topic() == cfg.data_topic("bench", "lat"):
            acked.setdefault(int(orjson.loads(key)["id"]), time.perf_counter())

    sink = KafkaSink(KafkaSinkSettings.from_config(bootstrap, cfg), on_acknowledged=on_ack)
    engine = Engine(cfg, sink, FileOffsetStore(work / "lat.json"))
    runner = threading.Thread(target=engine.run, daemon=True)
    runner.start()
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            sink.poll(0.002)

    poller = threading.Thread(target=serve, daemon=True)
    poller.start()
    client.bench.lat.insert_one({"_id": -1})  # warm-up: topic creation and producer id
    deadline = time.monotonic() + 30
    while -1 not in acked and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(count):
        client.bench.lat.insert_one({"_id": i, "v": i})
        written[i] = time.perf_counter()
        time.sleep(0.01)
    deadline = time.monotonic() + 30
    while len([i for i in written if i in acked]) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    poller.join()
    engine.stop()
    runner.join(30)
    sink.close()
    client.close()
    missing = [i for i in written if i not in acked]
    assert not missing, f"{len(missing)} documents never acknowledged"
    return [(acked[i] - written[i]) * 1000 for i in written]


NAME = "kafka streaming"
BASELINE = "the same engine streaming the same events from the same offset into the jsonl sink (fsync at every commit)"


def run(small: bool) -> list[harness.Row]:
    docs, latency_docs = (1_000, 50) if small else (20_000, 400)
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    try:
        with EmulatedReplicaSet(noop_interval=1.0) as emulated, KafkaBroker(None, work / "broker") as broker:
            jsonl, kafka = _throughput(emulated.uri, broker.bootstrap_servers, docs, work)
            latencies = sorted(_latency(emulated.uri, broker.bootstrap_servers, latency_docs, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    return [
        harness.Row(NAME, "engine -> kafka sink vs engine -> jsonl sink", BASELINE, kafka, jsonl, "events/s", kafka / jsonl),
        harness.Row(NAME, "insert -> Kafka acknowledgement, p99 vs p50", "the p50 of the same measurement",
                    p99, p50, "ms", p99 / p50),
    ]


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
