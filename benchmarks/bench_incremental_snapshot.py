"""Incremental snapshot throughput as a ratio to a blocking snapshot of the same collection.

Starts the emulator as a separate process (as mongod would be), fills one collection and copies
it twice per scenario: once as a blocking snapshot (``api.snapshot_collection``, the baseline: one
``find`` drained in order) and once as an incremental snapshot (``incremental_snapshot_collection``:
chunks of ``incremental.snapshot.chunk.size`` between watermarks, de-duplicated against the
stream). Both write into a sink that only counts, so the ratio is the cost of the watermark
algorithm itself. The second scenario repeats both runs while another thread keeps updating
random documents of the collection (the incremental run also streams and de-duplicates those).

Usage: ``python -m benchmarks.bench_incremental_snapshot`` (``MONGOCDC_BENCH_SMALL=1``: 2,000 documents)
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pymongo import MongoClient

from benchmarks import harness
from mongocdc_core.api import incremental_snapshot_collection, snapshot_collection
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_devstack.fixture import EmulatedReplicaSet

NAMESPACE = "bench.items"


class CountingSink:
    """Counts records; no I/O, so the runs measure capture, not delivery."""

    def __init__(self) -> None:
        self.records = 0

    def write(self, records: Sequence[Record]) -> None:
        self.records += len(records)

    def flush(self, timeout: float | None = None) -> None:
        """Nothing buffered."""

    def close(self) -> None:
        """Nothing to release."""


class Writer(threading.Thread):
    """Updates random existing documents until stopped (a busy application next to the snapshot)."""

    def __init__(self, uri: str, docs: int) -> None:
        super().__init__(daemon=True)
        self.uri = uri
        self.docs = docs
        self.halt = threading.Event()
        self.writes = 0

    def run(self) -> None:
        client: MongoClient[Any] = MongoClient(self.uri)
        rng = random.Random(7)
        with client:
            items = client.bench.items
            while not self.halt.is_set():
                items.update_one({"_id": rng.randrange(self.docs)}, {"$inc": {"n": 1}})
                self.writes += 1


def _timed(run: Callable[[], int]) -> float:
    start = time.perf_counter()
    documents = run()
    return documents / (time.perf_counter() - start)


def _scenario(cfg: ConnectorConfig, uri: str, docs: int, writes: bool) -> tuple[float, float, int]:
    """(blocking docs/s, incremental docs/s, concurrent writes) for one scenario."""
    writer = Writer(uri, docs) if writes else None
    if writer is not None:
        writer.start()
    try:
        blocking = _timed(lambda: snapshot_collection(cfg, NAMESPACE, CountingSink()).documents)
        incremental = _timed(lambda: incremental_snapshot_collection(cfg, NAMESPACE, CountingSink()).documents)
    finally:
        if writer is not None:
            writer.halt.set()
            writer.join()
    return blocking, incremental, writer.writes if writer is not None else 0


NAME = "incremental snapshot"
BASELINE = "a blocking snapshot (api.snapshot_collection: one find drained in order) of the same collection into the same counting sink"


def run(small: bool) -> list[harness.Row]:
    docs, chunk = (2_000, 256) if small else (20_000, 1024)
    rows = []
    with EmulatedReplicaSet(in_process=False, noop_interval=1.0, oplog_size_mb=512) as rs:
        client: MongoClient[Any] = MongoClient(rs.uri)
        with client:
            client.bench.items.insert_many(
                [{"_id": i, "name": f"item-{i}", "price": i % 97, "tags": ["a", "b"], "n": 0} for i in range(docs)]
            )
        cfg = ConnectorConfig.from_dict({
            "mongodb.connection.string": rs.uri,
            "topic.prefix": "bench",
            "collection.include.list": "bench\\..*",
            "signal.data.collection": "bench.signals",
            "incremental.snapshot.chunk.size": str(chunk),
            "poll.interval.ms": "20",
            "cursor.max.await.time.ms": "50",
        })
        snapshot_collection(cfg, NAMESPACE, CountingSink())  # warm-up: connections, caches
        for name, writes in (("idle collection", False), ("with concurrent updates", True)):
            blocking, incremental, count = _scenario(cfg, rs.uri, docs, writes)
            rows.append(harness.Row(NAME, f"incremental vs blocking snapshot, {name} ({count:,} concurrent writes)",
                                    BASELINE, incremental, blocking, "docs/s", incremental / blocking))
    return rows


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
