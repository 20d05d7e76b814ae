"""Throughput of the emulator's change streams as pymongo sees them.

Starts an emulated replica set in this process, writes N documents, then drains their N insert
events through ``collection.watch(start_at_operation_time=...)``. As a same-process baseline it
drains the same N documents with ``find``; the ratio shows how much dearer an event is than a
plain document, independent of the machine. The engine benchmarks need the emulator to deliver
well over 30k events/s so that they measure the engine, not the emulator.

Usage: ``python -m benchmarks.bench_emulator_stream [--docs 200000]``
"""

from __future__ import annotations

import argparse
import time

from bson import Timestamp
from pymongo import InsertOne, MongoClient
from rich.console import Console
from rich.table import Table

from mongocdc_core.devstack.fixture import EmulatedReplicaSet


def _write(client: MongoClient, count: int) -> Timestamp:
    """Insert ``count`` small documents; return the cluster time before the first write."""
    coll = client.bench.events
    coll.drop()
    client.bench.create_collection("events")
    start = client.admin.command("ping")["operationTime"]
    batch = 5000
    for base in range(0, count, batch):
        coll.bulk_write(
            [InsertOne({"_id": i, "name": f"doc-{i}", "value": i * 3, "tags": ["a", "b"]})
             for i in range(base, min(count, base + batch))],
            ordered=False,
        )
    return start


def _drain_stream(client: MongoClient, start: Timestamp, count: int) -> float:
    seen = 0
    began = time.perf_counter()
    with client.bench.events.watch(start_at_operation_time=start, max_await_time_ms=500) as stream:
        while seen < count:
            if stream.try_next() is not None:
                seen += 1
    return time.perf_counter() - began


def _drain_find(client: MongoClient, count: int) -> float:
    began = time.perf_counter()
    seen = sum(1 for _ in client.bench.events.find({}))
    if seen != count:
        raise RuntimeError(f"find returned {seen} documents, expected {count}")
    return time.perf_counter() - began


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200_000, help="documents to write and events to drain")
    args = parser.parse_args(argv)
    console = Console()
    with EmulatedReplicaSet(oplog_size_mb=1024, noop_interval=10.0) as emulated:
        client: MongoClient = MongoClient(emulated.uri, uuidRepresentation="standard")
        began = time.perf_counter()
        start = _write(client, args.docs)
        write_s = time.perf_counter() - began
        stream_s = _drain_stream(client, start, args.docs)
        find_s = _drain_find(client, args.docs)
        client.close()
    table = Table(title=f"emulator change stream drain ({args.docs} events)")
    table.add_column("measure")
    table.add_column("rate", justify="right")
    table.add_row("write (bulk insert)", f"{args.docs / write_s:,.0f} docs/s")
    table.add_row("change stream drain", f"{args.docs / stream_s:,.0f} events/s")
    table.add_row("find drain (baseline)", f"{args.docs / find_s:,.0f} docs/s")
    table.add_row("stream / find ratio", f"{find_s / stream_s:.2f}")
    console.print(table)


if __name__ == "__main__":
    main()
