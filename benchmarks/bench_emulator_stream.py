"""Throughput of the emulator's change streams as pymongo sees them.

Starts an emulated replica set in this process, writes N documents (``insert``), or
writes them and then updates each once (``update``: the stream drains the N update events), or
inserts them in transactions of 500 (``transaction``), then drains the N events through
``collection.watch(start_at_operation_time=...)``. As a same-process baseline it drains the N
documents with ``find``; the ratio shows how much dearer an event is than a plain document,
independent of the machine. Server and client share this process, so the process CPU time of a
drain (both sides' work) is reported next to wall time: on a loaded machine wall-clock rates
swing with the load, CPU-time rates much less.

The engine benchmarks need the emulator to deliver well over 30k insert events/s so that they
measure the engine, not the emulator.

It also drains the same events through a stream opened as the connector opens it (its
``$addFields``/``$match``/``$project`` stages, ``fullDocument: updateLookup`` and
``fullDocumentBeforeChange: whenAvailable`` on a collection with pre-images) and prints that
rate against the plain stream's: the goal is at least 0.7. Both drains decode events as raw BSON
(``RawBSONDocument``), so the ratio is the emulator's cost and not pymongo's decoding of the larger
events; they alternate over several rounds and the best of each counts.

Usage: ``python -m benchmarks.bench_emulator_stream`` (``MONGOCDC_BENCH_SMALL=1``: 2,000 documents)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bson import Timestamp
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import InsertOne, MongoClient, UpdateOne

from benchmarks import harness
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.source.stream import build_pipeline, watch_options
from mongocdc_devstack.fixture import EmulatedReplicaSet

WORKLOADS = ("insert", "update", "transaction")
BATCH = 5000
TRANSACTION_SIZE = 500
ROUNDS = 3


def _document(i: int) -> dict[str, object]:
    return {"_id": i, "name": f"doc-{i}", "value": i * 3, "tags": ["a", "b"]}


def _write(client: MongoClient, count: int, workload: str = "insert") -> Timestamp:
    """Write the workload; return the cluster time before its first event."""
    coll = client.bench.events
    coll.drop()
    client.bench.create_collection("events", changeStreamPreAndPostImages={"enabled": True})
    start = client.admin.command("ping")["operationTime"]
    if workload == "transaction":
        for base in range(0, count, TRANSACTION_SIZE):
            with client.start_session() as session, session.start_transaction():
                coll.insert_many([_document(i) for i in range(base, min(count, base + TRANSACTION_SIZE))], session=session)
        return start
    for base in range(0, count, BATCH):
        coll.bulk_write([InsertOne(_document(i)) for i in range(base, min(count, base + BATCH))], ordered=False)
    if workload == "update":
        start = client.admin.command("ping")["operationTime"]
        for base in range(0, count, BATCH):
            coll.bulk_write(
                [UpdateOne({"_id": i}, {"$set": {"value": -i, "seen": True}}) for i in range(base, min(count, base + BATCH))],
                ordered=False,
            )
    return start


def _timed(run: Callable[[], int]) -> tuple[int, float, float]:
    """(items, wall seconds, process CPU seconds) of ``run``."""
    wall, cpu = time.perf_counter(), time.process_time()
    items = run()
    return items, time.perf_counter() - wall, time.process_time() - cpu


def _connector_stream() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The pipeline and watch options the connector uses for this collection (update-full with pre-images)."""
    cfg = ConnectorConfig({"topic.prefix": "bench", "mongodb.connection.string": "mongodb://127.0.0.1/?replicaSet=rs0",
                           "collection.include.list": "bench.events", "signal.data.collection": "bench.signals",
                           "capture.mode": "change_streams_update_full_with_pre_image"})  # fmt: skip
    return build_pipeline(cfg), watch_options(cfg)


def _drain_stream(client: MongoClient, start: Timestamp, count: int, pipeline: list[dict[str, Any]] | None = None,
                  options: dict[str, Any] | None = None) -> int:  # fmt: skip
    seen = 0
    events = client.get_database("bench", codec_options=CodecOptions(document_class=RawBSONDocument)).events
    with events.watch(pipeline, start_at_operation_time=start, max_await_time_ms=500, **(options or {})) as stream:
        while seen < count:
            if stream.try_next() is not None:
                seen += 1
    return seen


def _drain_find(client: MongoClient, count: int) -> int:
    seen = sum(1 for _ in client.bench.events.find({}))
    if seen != count:
        raise RuntimeError(f"find returned {seen} documents, expected {count}")
    return seen


NAME = "emulator stream"
BASELINE = "a find({}) drain of the same documents from the same in-process emulator (process CPU time)"
CONNECTOR_BASELINE = "a plain change stream drain of the same events (process CPU time)"


def run(small: bool) -> list[harness.Row]:
    count = 2_000 if small else 200_000
    rows = []
    for workload in WORKLOADS:
        with EmulatedReplicaSet(oplog_size_mb=1024, noop_interval=10.0) as emulated:
            client: MongoClient = MongoClient(emulated.uri, uuidRepresentation="standard")
            start = _write(client, count, workload)
            docs, _, find_cpu = _timed(lambda: _drain_find(client, count))  # noqa: B023
            pipeline, options = _connector_stream()
            # Alternating rounds, best of each: on a shared machine one drain can be slowed by others.
            plain_cpu, piped_cpu = [], []
            for _ in range(ROUNDS):
                events, _, cpu = _timed(lambda: _drain_stream(client, start, count))  # noqa: B023
                plain_cpu.append(cpu)
                piped, _, cpu = _timed(lambda: _drain_stream(client, start, count, pipeline, options))  # noqa: B023
                piped_cpu.append(cpu)
            client.close()
        stream_cpu, connector_cpu = min(plain_cpu), min(piped_cpu)
        rows.append(harness.Row(NAME, f"change stream drain, {workload} events (both sides' CPU)", BASELINE,
                                events / stream_cpu, docs / find_cpu, "events/CPU-s", find_cpu / stream_cpu))
        rows.append(harness.Row(NAME, f"the connector's stream (its stages, updateLookup, pre-images), {workload} events",
                                CONNECTOR_BASELINE, piped / connector_cpu, events / stream_cpu, "events/CPU-s",
                                stream_cpu / connector_cpu, target=0.7))
    return rows


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
