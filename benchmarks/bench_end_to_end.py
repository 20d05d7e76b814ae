"""End-to-end throughput: emulator -> engine -> jsonl, as a ratio to a plain pymongo drain.

Both runs read the same change stream (the same ~100k inserts, the same watch options) from
the same emulator process; the baseline only iterates the stream, the engine also converts every
event into a Debezium record, writes it to a JSONL sink and records offsets. The printed ratio is
engine throughput / baseline throughput (target >= 0.7).

Usage: python benchmarks/bench_end_to_end.py [events]   (default 100000)
"""

from __future__ import annotations

import sys
import tempfile
import time
from typing import Any

from pymongo import MongoClient

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.engine import Engine
from mongocdc_core.offsets import MemoryOffsetStore, Offset
from mongocdc_core.positions import Position, decode_resume_token_timestamp
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.source.stream import build_pipeline, watch_options
from mongocdc_devstack.fixture import EmulatedReplicaSet


def _config(uri: str) -> ConnectorConfig:
    return ConnectorConfig.from_dict(
        {
            "mongodb.connection.string": uri,
            "topic.prefix": "bench",
            "collection.include.list": "bench\\..*",
            "snapshot.mode": "no_data",
            "mongocdc.schemas.enable": "false",
            "cursor.max.await.time.ms": "200",
            "poll.interval.ms": "50",
        }
    )


def _load(client: MongoClient[Any], events: int) -> dict[str, Any]:
    """Insert ``events`` documents; return the resume token from just before them."""
    with client.watch([]) as stream:
        token = stream.resume_token
    assert token is not None
    coll = client.bench.items
    batch = 1000
    for start in range(0, events, batch):
        coll.insert_many(
            [{"_id": i, "name": f"item-{i}", "qty": i % 97, "tags": ["a", "b"]} for i in range(start, min(events, start + batch))]
        )
    return dict(token)


def _baseline(client: MongoClient[Any], cfg: ConnectorConfig, token: dict[str, Any], events: int) -> float:
    started = time.perf_counter()
    seen = 0
    with client.watch(
        build_pipeline(cfg), resume_after=token, batch_size=cfg.max_batch_size, max_await_time_ms=200, **watch_options(cfg)
    ) as stream:
        while seen < events:
            if stream.try_next() is not None:
                seen += 1
    return time.perf_counter() - started


def _engine(cfg: ConnectorConfig, token: dict[str, Any], events: int) -> float:
    position = Position.from_timestamp(decode_resume_token_timestamp(token))
    offsets = MemoryOffsetStore(Offset(resume_token=token, position=position))
    with tempfile.TemporaryDirectory() as out:
        sink = JsonlSink(out)
        started = time.perf_counter()
        summary = Engine(cfg, sink, offsets).run(max_events=events)
        sink.close()
        elapsed = time.perf_counter() - started
    if summary.events != events:
        raise RuntimeError(f"engine dispatched {summary.events} events, expected {events}")
    return elapsed


def main(argv: list[str]) -> int:
    events = int(argv[1]) if len(argv) > 1 else 100_000
    with EmulatedReplicaSet(in_process=False, oplog_size_mb=1024) as rs:
        client: MongoClient[Any] = MongoClient(rs.uri)
        cfg = _config(rs.uri)
        token = _load(client, events)
        _baseline(client, cfg, token, min(events, 2000))  # warm-up (emulator caches, connections)
        base = _baseline(client, cfg, token, events)
        engine = _engine(cfg, token, events)
        client.close()
    print(f"events: {events}")
    print(f"baseline pymongo drain: {base:.2f} s ({events / base:,.0f} events/s)")
    print(f"engine -> jsonl:        {engine:.2f} s ({events / engine:,.0f} events/s)")
    print(f"ratio (engine throughput / baseline): {base / engine:.2f}  (target >= 0.70)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
