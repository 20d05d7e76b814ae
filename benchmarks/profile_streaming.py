"""Profile of the streaming path: where the connector's own CPU goes, top functions by self time.

Starts the emulator as a separate process (so this process holds only the connector), writes N
inserts and N updates (``updateLookup``) into one collection, then streams the 2N events through
``Engine`` into a JSON Lines sink (or ``--sink parquet``: the Parquet landing) under cProfile (schemas
on, Debezium's default) and prints the ``--top`` functions by self time. Not a benchmark (no ratio): it
says what to work on next.

Usage: ``python -m benchmarks.profile_streaming [--docs 20000] [--top 10] [--sink jsonl|parquet]``
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
from typing import Any

from pymongo import MongoClient, UpdateOne

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.sinks.base import Sink
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_devstack.fixture import EmulatedReplicaSet


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--sink", choices=("jsonl", "parquet"), default="jsonl")
    args = parser.parse_args(argv)
    with EmulatedReplicaSet(in_process=False, oplog_size_mb=1024, noop_interval=1.0) as rs, \
            tempfile.TemporaryDirectory() as out:
        cfg = ConnectorConfig.from_dict({
            "mongodb.connection.string": rs.uri, "topic.prefix": "prof", "collection.include.list": r"bench\..*",
            "snapshot.mode": "no_data", "poll.interval.ms": "20", "cursor.max.await.time.ms": "100",
        })
        offsets = MemoryOffsetStore()
        Engine(cfg, JsonlSink(out), offsets).run(until_idle=0.3)  # pins the start
        client: MongoClient[dict[str, Any]] = MongoClient(rs.uri)
        coll = client.bench.items
        for base in range(0, args.docs, 1000):
            coll.insert_many([{"_id": i, "name": f"item-{i}", "qty": i % 97, "price": i / 7, "tags": ["a", "b"],
                               "address": {"city": "Lyon", "zip": "69000"}} for i in range(base, min(args.docs, base + 1000))])
        for base in range(0, args.docs, 1000):
            coll.bulk_write([UpdateOne({"_id": i}, {"$set": {"qty": -i, "seen": True}})
                             for i in range(base, min(args.docs, base + 1000))])
        client.close()
        sink: Sink = JsonlSink(out) if args.sink == "jsonl" else ParquetSink(out)
        profile = cProfile.Profile()
        profile.enable()
        summary = Engine(cfg, sink, offsets).run(max_events=2 * args.docs)
        sink.close()
        profile.disable()
    text = io.StringIO()
    stats = pstats.Stats(profile, stream=text)
    stats.sort_stats("tottime").print_stats(args.top)
    print(f"streamed {summary.events} events")
    print(text.getvalue())


if __name__ == "__main__":
    main()
