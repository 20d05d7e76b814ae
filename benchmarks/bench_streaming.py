"""Streaming: CPU per event and end-to-end events/s, against bare loops on the same change stream.

The emulator runs in its own process (as mongod would), holding N inserts followed by N updates
(``updateLookup``) of one collection; every run reads the same 2N events from the same resume
token with the connector's own pipeline and watch options (``build_pipeline``, ``watch_options``,
``max.batch.size``).

- CPU per event: the connector (``Engine`` streaming into a ``JsonlSink``, schemas off, offsets
  saved) against a bare pymongo drain of the same stream that also writes every event with
  ``orjson.dumps(event, default=json_util.default)`` (bare drain + bare conversion), both in this
  process's CPU time; ratio = connector / bare, goal <= 1.5.
- End to end: the connector's events/s against a bare drain that only iterates the stream
  (wall clock); ratio = connector / bare, goal >= 0.8. When the emulator is the bottleneck both
  runs wait on it; the emulator's own CPU per event is reported next to the connector's, so it is
  visible which side bounds the figure.

Five interleaved rounds, medians (three varied by ±0.1 from run to run). Usage: ``python -m benchmarks.bench_streaming``
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Any

import orjson
from bson import json_util
from pymongo import MongoClient, UpdateOne

from benchmarks import harness
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import MemoryOffsetStore, Offset
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.source.stream import build_pipeline, watch_options
from mongocdc_devstack.fixture import EmulatedReplicaSet

NAME = "streaming"
BASELINE = (
    "a bare pymongo drain of the same change stream (same pipeline, watch options and batch size, same resume "
    "token): with orjson.dumps(event, default=json_util.default) per event for CPU per event, iterating only "
    "for end-to-end events/s; 5 interleaved rounds, medians"
)
ROUNDS = 5
_TICKS = os.sysconf("SC_CLK_TCK")


def config(uri: str) -> ConnectorConfig:
    return ConnectorConfig.from_dict({
        "mongodb.connection.string": uri, "topic.prefix": "bench", "collection.include.list": r"bench\..*",
        "snapshot.mode": "no_data", "mongocdc.schemas.enable": "false", "cursor.max.await.time.ms": "200",
        "poll.interval.ms": "20",
    })  # fmt: skip


def load(client: MongoClient[Any], docs: int) -> None:
    coll = client.bench.items
    for base in range(0, docs, 1000):
        coll.insert_many([
            {"_id": i, "name": f"item-{i}", "qty": i % 97, "price": i / 7, "tags": ["a", "b"],
             "address": {"city": "Lyon", "zip": f"{69000 + i % 9}"}}
            for i in range(base, min(docs, base + 1000))
        ])  # fmt: skip
    for base in range(0, docs, 1000):
        coll.bulk_write([UpdateOne({"_id": i}, {"$set": {"qty": -i, "seen": True}}) for i in range(base, min(docs, base + 1000))])


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


class Measure:
    """Wall, this process's CPU, and the emulator's CPU over a block."""

    def __init__(self, emulator_pid: int) -> None:
        self.pid = emulator_pid

    def __enter__(self) -> Measure:
        self._wall, self._cpu, self._emu = time.perf_counter(), time.process_time(), process_cpu(self.pid)
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._wall
        self.cpu = time.process_time() - self._cpu
        self.emulator_cpu = process_cpu(self.pid) - self._emu


def bare_drain(client: MongoClient[Any], cfg: ConnectorConfig, token: dict[str, Any], events: int, dump: bool) -> None:
    seen = 0
    with client.watch(build_pipeline(cfg), resume_after=token, batch_size=cfg.max_batch_size,
                      max_await_time_ms=200, **watch_options(cfg)) as stream:  # fmt: skip
        while seen < events:
            change = stream.try_next()
            if change is not None:
                seen += 1
                if dump:
                    orjson.dumps(change, default=json_util.default)


def connector(cfg: ConnectorConfig, offset: Offset, events: int, out: str) -> None:
    sink = JsonlSink(out)
    summary = Engine(cfg, sink, MemoryOffsetStore(offset)).run(max_events=events)
    sink.close()
    if summary.events != events:
        raise RuntimeError(f"the connector dispatched {summary.events} events, expected {events}")


def run(small: bool) -> list[harness.Row]:
    docs = 1_000 if small else 50_000
    events = 2 * docs
    with EmulatedReplicaSet(in_process=False, oplog_size_mb=1024, noop_interval=1.0) as rs, \
            tempfile.TemporaryDirectory() as tmp:
        assert rs.process is not None
        pid = rs.process.pid
        cfg = config(rs.uri)
        pinned = MemoryOffsetStore()
        Engine(cfg, JsonlSink(f"{tmp}/pin"), pinned).run(until_idle=0.3)
        start = pinned.load()
        assert start is not None and start.resume_token is not None
        client: MongoClient[Any] = MongoClient(rs.uri)
        load(client, docs)
        bare_drain(client, cfg, start.resume_token, min(events, 2000), dump=False)  # warm-up
        rounds = []
        for n in range(ROUNDS):
            with Measure(pid) as drain:
                bare_drain(client, cfg, start.resume_token, events, dump=False)
            with Measure(pid) as dumped:
                bare_drain(client, cfg, start.resume_token, events, dump=True)
            with Measure(pid) as engine:
                connector(cfg, Offset(resume_token=start.resume_token, position=start.position), events, f"{tmp}/r{n}")
            rounds.append((drain, dumped, engine))
        client.close()

    def med(values: list[float]) -> float:
        return statistics.median(values)

    cpu_engine = med([r[2].cpu / events * 1e6 for r in rounds])
    cpu_bare = med([r[1].cpu / events * 1e6 for r in rounds])
    rate_engine = med([events / r[2].wall for r in rounds])
    rate_drain = med([events / r[0].wall for r in rounds])
    emu_engine = med([r[2].emulator_cpu / events * 1e6 for r in rounds])
    emu_drain = med([r[0].emulator_cpu / events * 1e6 for r in rounds])
    return [
        harness.Row(NAME, "CPU per event, connector -> jsonl vs bare drain + orjson.dumps", BASELINE,
                    cpu_engine, cpu_bare, "µs", med([r[2].cpu / r[1].cpu for r in rounds]), 1.5, "<="),
        harness.Row(NAME, "end-to-end events/s, connector -> jsonl vs bare drain", BASELINE,
                    rate_engine, rate_drain, "events/s", med([r[0].wall / r[2].wall for r in rounds]), 0.8),
        harness.Row(NAME, "emulator CPU per event while the connector streams (vs bare drain)", BASELINE,
                    emu_engine, emu_drain, "µs", emu_engine / emu_drain),
        harness.Row(NAME, "connector CPU per event vs emulator CPU per event (share of the work)", BASELINE,
                    cpu_engine, emu_engine, "µs", cpu_engine / emu_engine),
    ]  # fmt: skip


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
