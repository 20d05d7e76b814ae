"""Memory: peak RSS stays flat over a long stream, and the queue bound holds under a slow sink.

The emulator runs in its own process, so this process's RSS (``/proc/self/status`` VmRSS, sampled
every 0.2 s) is the connector's own.

- Flat: 1,000,000 inserts streamed by ``Engine`` into a ``JsonlSink`` (schemas on, Debezium's
  default). Baseline: the peak RSS over the first half of the stream (queue filled, everything
  warm). Ratio = peak RSS over the second half / that baseline (goal <= 1.05: no growth); the
  RSS after 10 %, 25 %, 50 %, 75 % and 100 % of the events is reported against the same baseline.
- Bounded: ``max.queue.size=512`` and ``max.queue.size.in.bytes=1 MiB`` with a sink that sleeps
  2 ms per record, so MongoDB outruns the connector and the reader blocks on the queue. The queue's
  fill level (``QueueRemainingCapacity``, ``CurrentQueueSizeInBytes``) is sampled; ratios = peak /
  bound (goal <= 1.0), and the RSS growth while throttled is reported.

Usage: ``python -m benchmarks.bench_memory`` (``MONGOCDC_BENCH_SMALL=1``: 20,000 events)
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from pymongo import MongoClient

from benchmarks import harness
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.events.records import Record
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_devstack.fixture import EmulatedReplicaSet

NAME = "memory"
BASELINE = (
    "this process's peak RSS over the first half of a long stream (flatness); the configured max.queue.size / "
    "max.queue.size.in.bytes (bound under a slow sink)"
)
QUEUE_ITEMS = 512
QUEUE_BYTES = 1 << 20


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class Sampler(threading.Thread):
    """Samples RSS and the queue's fill level while the stream runs."""

    def __init__(self, metrics: ConnectorMetrics, events_seen: Any) -> None:
        super().__init__(daemon=True)
        self.metrics = metrics
        self.events_seen = events_seen
        self.samples: list[tuple[int, int, int, int]] = []  # (events, rss, queued items, queued bytes)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.2):
            streaming = self.metrics.streaming
            queued = streaming.QueueTotalCapacity - streaming.QueueRemainingCapacity
            self.samples.append((self.events_seen(), rss_bytes(), queued, streaming.CurrentQueueSizeInBytes))


class SlowSink(JsonlSink):
    """A jsonl sink that takes 2 ms per record (a slow disk or a slow broker): 500 records/s."""

    def write(self, records: Sequence[Record]) -> None:
        time.sleep(0.002 * len(records))
        super().write(records)


def _config(uri: str, **extra: str) -> ConnectorConfig:
    return ConnectorConfig.from_dict({
        "mongodb.connection.string": uri, "topic.prefix": "mem", "collection.include.list": r"bench\..*",
        "snapshot.mode": "no_data", "cursor.max.await.time.ms": "200", "poll.interval.ms": "20", **extra,
    })  # fmt: skip


def _stream(cfg: ConnectorConfig, sink: JsonlSink, offsets: MemoryOffsetStore, events: int) -> Sampler:
    engine = Engine(cfg, sink, offsets)
    metrics = engine.metrics
    sampler = Sampler(metrics, lambda: metrics.streaming.TotalNumberOfEventsSeen)
    sampler.start()
    try:
        summary = engine.run(max_events=events)
    finally:
        sampler.stop.set()
        sampler.join()
        sink.close()
    if summary.events != events:
        raise RuntimeError(f"streamed {summary.events} of {events} events")
    return sampler


def run(small: bool) -> list[harness.Row]:
    events = 20_000 if small else 1_000_000
    slow_events = 1_000 if small else 10_000
    with EmulatedReplicaSet(in_process=False, oplog_size_mb=4096, noop_interval=1.0) as rs, \
            tempfile.TemporaryDirectory() as tmp:
        cfg = _config(rs.uri)
        offsets = MemoryOffsetStore()
        Engine(cfg, JsonlSink(f"{tmp}/pin"), offsets).run(until_idle=0.3)
        pinned = offsets.load()
        client: MongoClient[Any] = MongoClient(rs.uri)
        for base in range(0, events, 5000):
            client.bench.items.insert_many([
                {"_id": i, "name": f"item-{i}", "qty": i % 97, "tags": ["a", "b"], "note": "x" * 200}
                for i in range(base, min(events, base + 5000))
            ])  # fmt: skip
        client.close()
        flat = _stream(cfg, JsonlSink(f"{tmp}/flat"), offsets, events)
        slow_cfg = _config(rs.uri, **{"max.queue.size": str(QUEUE_ITEMS), "max.queue.size.in.bytes": str(QUEUE_BYTES),
                                      "max.batch.size": "256"})  # fmt: skip
        slow = _stream(slow_cfg, SlowSink(f"{tmp}/slow"), MemoryOffsetStore(pinned), slow_events)
    first = [rss for seen, rss, _, _ in flat.samples if seen <= events // 2]
    second = [rss for seen, rss, _, _ in flat.samples if seen > events // 2]
    baseline = max(first or [flat.samples[0][1]])
    peak = max(second or [flat.samples[-1][1]])
    slow_rss = [rss for _, rss, _, _ in slow.samples]
    peak_items = max(items for _, _, items, _ in slow.samples)
    peak_bytes = max(size for _, _, _, size in slow.samples)
    mib = 1 << 20
    rows = [
        harness.Row(NAME, f"peak RSS, 2nd half of {events:,} streamed events vs 1st half", BASELINE,
                    peak / mib, baseline / mib, "MiB", peak / baseline, 1.05, "<="),
    ]
    for percent in (10, 25, 50, 75, 100):
        at = next((rss for seen, rss, _, _ in flat.samples if seen >= events * percent // 100), flat.samples[-1][1])
        rows.append(harness.Row(NAME, f"RSS after {percent}% of the events", BASELINE, at / mib, baseline / mib, "MiB",
                                at / baseline))
    return rows + [
        harness.Row(NAME, "slow sink: peak queued events vs max.queue.size", BASELINE,
                    peak_items, QUEUE_ITEMS, "events", peak_items / QUEUE_ITEMS, 1.0, "<="),
        harness.Row(NAME, "slow sink: peak queued bytes vs max.queue.size.in.bytes", BASELINE,
                    peak_bytes / 1024, QUEUE_BYTES / 1024, "KiB", peak_bytes / QUEUE_BYTES, 1.0, "<="),
        harness.Row(NAME, "slow sink: peak RSS vs RSS when throttling began", BASELINE,
                    max(slow_rss) / mib, slow_rss[0] / mib, "MiB", max(slow_rss) / slow_rss[0]),
    ]  # fmt: skip


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
