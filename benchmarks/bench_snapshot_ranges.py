"""Snapshot of one big collection by ``_id`` ranges: threads, and the cost of an interruption.

Baseline, in this process against the same server: a bare pymongo ``find({})`` drain of the
collection (no conversion, no sink). Measured: the connector's snapshot (``snapshot.mode=initial_only``,
records converted and handed to a sink that only counts them, so a chunk's RecordRun is never
taken apart; one more row lands the 1-thread snapshot in JSON Lines files) with 1, 2 and 4 threads, each as
documents/s and as a ratio to the baseline, timed from the snapshot's start (before its ranges are
planned) to its end, as the baseline is timed from its first read to its last (the whole engine run,
with connecting and closing the client, is a row of its own); and a snapshot stopped at 90 % and resumed, whose total
time against one uninterrupted snapshot gives the time lost to the interruption (before ranges
were resumable, a restart re-read the whole collection: about 90 % lost), the median of 7 rounds
(3 at CI size) with their spread.

The emulator (a separate process) is the server here; a reference row drains the raw batches
alone (what it can serve). Whether more threads can add anything on this machine is answered by
rows of the cores busy during each snapshot: the connector's process CPU plus the server's (from
``/proc``), over the snapshot's wall time, against the machine's cores. On this 2-core machine the
emulator serves about what one thread converts, so threads add little there; where the server is not
the limit, they do: the same snapshots run again against a server whose every read (``find`` and
``getMore``) takes 5 ms more to answer (mongod's ``failCommand`` fail point with ``blockConnection``:
a round trip across a network plus a read from disk), against the bare drain under the same delay,
and the 2- and 4-thread runs are compared with the 1-thread run (goals 1.5x and 2.5x).
Usage: ``python -m benchmarks.bench_snapshot_ranges`` (1,000,000 documents; ``MONGOCDC_BENCH_SMALL=1``: 20,000).
"""

from __future__ import annotations

import datetime
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pymongo import MongoClient

from benchmarks import harness
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.events import EventConverter, EventOptions
from mongocdc_core.events.records import Record
from mongocdc_core.offsets import FileOffsetStore, MemoryOffsetStore, OffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.sinks.jsonl import JsonlSink
from mongocdc_core.source.ranges import plan_ranges
from mongocdc_core.source.snapshot import raw_batches
from mongocdc_devstack.fixture import EmulatedReplicaSet


class CountingSink:
    """Accepts records and counts them: the benchmark measures the connector, not a file system."""

    def __init__(self) -> None:
        self.records = 0

    def write(self, records: Sequence[Record]) -> None:
        self.records += len(records)

    def flush(self, timeout: float | None = None) -> None:
        """Nothing is buffered."""

    def close(self) -> None:
        """Nothing to release."""


class _CountedJsonl(JsonlSink):
    """The landing zone's JSON Lines sink, counting what it wrote."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.records = 0

    def write(self, records: Sequence[Record]) -> None:
        super().write(records)
        self.records += len(records)


def _process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) of process ``pid`` so far, from ``/proc`` (0 where unreadable)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


class Timing(ProgressListener):
    """When the snapshot started (before its ranges are planned) and when it finished, and the CPU
    the connector (this process) and the server (``server_pid``) used in between."""

    def __init__(self, server_pid: int | None = None) -> None:
        self.server_pid = server_pid
        self.started = self.finished = 0.0
        self._cpu = (0.0, 0.0)
        self.connector_cpu = self.server_cpu = 0.0

    def snapshot_started(self, totals: Mapping[str, int | None]) -> None:
        self.started = time.perf_counter()
        self._cpu = (time.process_time(), _process_cpu(self.server_pid))

    def snapshot_finished(self, completed: bool, documents: int) -> None:
        self.finished = time.perf_counter()
        self.connector_cpu = time.process_time() - self._cpu[0]
        self.server_cpu = _process_cpu(self.server_pid) - self._cpu[1]


class StopAt(Timing):
    """Stops the engine once ``limit`` documents were copied."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.engine: Engine | None = None

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        if copied >= self.limit and self.engine is not None:
            self.engine.stop()


def _config(uri: str, threads: int, split: int) -> ConnectorConfig:
    return ConnectorConfig.from_dict({
        "mongodb.connection.string": uri, "topic.prefix": "bench", "collection.include.list": r"bench\.big",
        "snapshot.mode": "initial_only", "snapshot.max.threads": str(threads), "mongocdc.snapshot.split.size": str(split),
        "mongocdc.schemas.enable": "false", "snapshot.fetch.size": "1000", "offset.flush.interval.ms": "600000",
    })


def _snapshot(cfg: ConnectorConfig, offsets: OffsetStore, timing: Timing, landing: Path | None = None) -> tuple[float, float, int]:
    """The snapshot's own time (planning included), the engine's whole run (connecting, and closing
    the client) and the records delivered (into
    JSON Lines files under ``landing`` when given, else counted only)."""
    sink: CountingSink | _CountedJsonl = CountingSink() if landing is None else _CountedJsonl(landing)
    engine = Engine(cfg, sink, offsets, progress=timing)
    if isinstance(timing, StopAt):
        timing.engine = engine
    start = time.perf_counter()
    engine.run()
    return timing.finished - timing.started, time.perf_counter() - start, sink.records


def _seed(uri: str, count: int) -> None:
    client: MongoClient = MongoClient(uri)
    with client:
        coll = client.bench.big
        coll.drop()
        batch = 20_000
        for first in range(0, count, batch):
            coll.insert_many(
                [{"_id": i, "name": f"customer-{i}", "value": i * 3, "tags": ["a", "b"], "city": "Lyon"}
                 for i in range(first, min(count, first + batch))],
                ordered=False,
            )


def _bare_find(uri: str, count: int) -> float:
    client: MongoClient = MongoClient(uri)
    with client:
        start = time.perf_counter()
        seen = sum(1 for _ in client.bench.big.find({}, batch_size=1000))
        elapsed = time.perf_counter() - start
    assert seen == count, f"drained {seen} of {count}"
    return count / elapsed


def _raw_drain(uri: str, count: int) -> float:
    """Docs/s of the same collection read the way a range reader asks for it (raw batches in ``_id``
    order, no conversion): what the server can serve the snapshot at most."""
    client: MongoClient = MongoClient(uri, connectTimeoutMS=600_000)
    with client:
        start = time.perf_counter()
        seen = sum(len(batch) for batch in raw_batches(client.bench.big, {}, 1000))
        elapsed = time.perf_counter() - start
    assert seen == count, f"drained {seen} of {count}"
    return count / elapsed


def _find_and_convert(uri: str, count: int, cfg: ConnectorConfig) -> float:
    """Docs/s of that read plus the one thing a snapshot must add per document, its conversion to a
    record (one raw batch of 1,000 at a time, in the same thread; no engine, no read-ahead)."""
    converter = EventConverter(EventOptions.from_config(cfg, rs="rs0"))
    position, read_at = Position(1, 1), datetime.datetime.now(datetime.UTC)
    markers = ["true"] * 1000
    client: MongoClient = MongoClient(uri, connectTimeoutMS=600_000)
    with client:
        start = time.perf_counter()
        seen = 0
        for batch in raw_batches(client.bench.big, {}, 1000):
            seen += len(converter.convert_reads(batch, markers[: len(batch)], "bench", "big", position, read_at))
        elapsed = time.perf_counter() - start
    assert seen == count, f"converted {seen} of {count}"
    return count / elapsed


def _plan_seconds(uri: str, split: int) -> tuple[float, int]:
    """How long planning the ranges takes ($sample on the server) and how many ranges it gives."""
    client: MongoClient = MongoClient(uri, connectTimeoutMS=600_000)
    with client:
        start = time.perf_counter()
        ranges = plan_ranges(client.bench.big, split)
        return time.perf_counter() - start, len(ranges)


@contextmanager
def _slow_reads(uri: str, block_ms: int) -> Iterator[None]:
    """Every ``find`` and ``getMore`` waits ``block_ms`` at the server before it is answered (the
    connection alone waits: other cursors are served meanwhile, as by a real server)."""
    client: MongoClient = MongoClient(uri)
    with client:
        client.admin.command("configureFailPoint", "failCommand", mode="alwaysOn", data={
            "failCommands": ["find", "getMore"], "blockConnection": True, "blockTimeMS": block_ms})
        try:
            yield
        finally:
            client.admin.command("configureFailPoint", "failCommand", mode="off")


def _latency_rows(uri: str, count: int, split: int, block_ms: int) -> list[harness.Row]:
    """The snapshot with 1, 2 and 4 threads against a server that takes ``block_ms`` per read."""
    label = f"{block_ms} ms per read round trip"
    baseline_text = f"{BASELINE}, every find/getMore answered {block_ms} ms later (failCommand blockConnection)"
    rows = []
    with _slow_reads(uri, block_ms):
        baseline = _bare_find(uri, count)
        rates = {}
        for threads in (1, 2, 4):
            elapsed, _, records = _snapshot(_config(uri, threads, split), MemoryOffsetStore(), Timing())
            assert records == count, f"{records} records for {count} documents"
            rates[threads] = count / elapsed
            rows.append(harness.Row(NAME, f"snapshot, {threads} thread(s), {count // split} ranges, {label}",
                                    baseline_text, rates[threads], baseline, "docs/s", rates[threads] / baseline,
                                    0.8 if threads == 1 else None, ">="))
    for threads, target in ((2, 1.5), (4, 2.5)):
        rows.append(harness.Row(NAME, f"{threads} threads against 1, {label} (the server is not the limit)",
                                "the 1-thread snapshot against the same server", rates[threads], rates[1],
                                "docs/s", rates[threads] / rates[1], target, ">="))
    return rows


@dataclass(frozen=True)
class Interruption:
    """The time lost to a stop at 90 % and a resume, over several rounds."""

    lost: float  #: the median of the rounds' shares of time lost
    interrupted: float  #: that round's stopped and resumed runs together (s)
    uninterrupted: float  #: the uninterrupted time it was compared with (s)
    least: float  #: the smallest share of any round
    most: float  #: the largest share of any round
    rounds: int
    twice: int  #: the most documents any round read twice


def _interruption(uri: str, count: int, split: int, uninterrupted: float, rounds: int) -> Interruption:
    """``rounds`` rounds of a 2-thread snapshot stopped at 90 % and resumed.

    Whole runs on both sides (the restart's own costs count as lost). Each interrupted snapshot is
    compared with the mean of the uninterrupted runs just before and just after it, so a change in
    the machine's load weighs on both sides alike; the figure is the median of the rounds' shares.
    At about a second per snapshot, one round is noise: the restart's fixed cost (a tenth of a
    second or so) moves with the machine, so the rounds' spread is reported too.
    """
    shares: list[tuple[float, float, float]] = []
    twice = 0
    before = uninterrupted
    for _ in range(rounds):
        with tempfile.TemporaryDirectory() as tmp:
            offsets = FileOffsetStore(Path(tmp) / "offsets.json")
            _, first, copied = _snapshot(_config(uri, 2, split), offsets, StopAt(int(count * 0.9)))
            _, second, rest = _snapshot(_config(uri, 2, split), offsets, Timing())
        twice = max(twice, copied + rest - count)
        _, after, _ = _snapshot(_config(uri, 2, split), MemoryOffsetStore(), Timing())
        full = (before + after) / 2
        shares.append(((first + second - full) / full, first + second, full))
        before = after
    shares.sort()
    lost, interrupted, full = shares[len(shares) // 2]
    return Interruption(lost, interrupted, full, shares[0][0], shares[-1][0], rounds, twice)


NAME = "snapshot"
BASELINE = "a bare pymongo find({}) drain of the same collection (batch size 1000), same process, same server"


def run(small: bool) -> list[harness.Row]:
    count = 20_000 if small else 1_000_000
    split = max(1_000, count // 16)
    rows = []
    with EmulatedReplicaSet(in_process=False, noop_interval=0, oplog_size_mb=256) as rs:
        _seed(rs.uri, count)
        baseline = _bare_find(rs.uri, count)
        serving = _raw_drain(rs.uri, count)
        rows.append(harness.Row(NAME, "reference: raw batches in _id order, no conversion (what the server serves)",
                                BASELINE, serving, baseline, "docs/s", serving / baseline))
        converting = _find_and_convert(rs.uri, count, _config(rs.uri, 1, split))
        rows.append(harness.Row(NAME, "reference: those batches + convert_reads, one thread, no engine, no read-ahead",
                                BASELINE, converting, baseline, "docs/s", converting / baseline))
        plan_s, planned = _plan_seconds(rs.uri, split)
        server_pid = rs.process.pid if rs.process is not None else None
        elapsed_by_threads: dict[int, float] = {}
        whole_runs: dict[int, float] = {}
        timings: dict[int, Timing] = {}
        for threads in (1, 4, 2):  # 2 last: the interrupted snapshot below is compared with it
            timings[threads] = Timing(server_pid)
            elapsed, whole_runs[threads], records = _snapshot(
                _config(rs.uri, threads, split), MemoryOffsetStore(), timings[threads]
            )
            assert records == count, f"{records} records for {count} documents"
            elapsed_by_threads[threads] = elapsed
        with tempfile.TemporaryDirectory() as tmp:
            elapsed, _, records = _snapshot(_config(rs.uri, 1, split), MemoryOffsetStore(), Timing(), Path(tmp))
            assert records == count, f"{records} records written for {count} documents"
        rows.append(harness.Row(NAME, "snapshot, 1 thread, into the landing zone's JSON Lines files", BASELINE,
                                count / elapsed, baseline, "docs/s", count / elapsed / baseline))
        for threads, elapsed in sorted(elapsed_by_threads.items()):
            rows.append(harness.Row(NAME, f"snapshot, {threads} thread(s), {count // split} ranges", BASELINE,
                                    count / elapsed, baseline, "docs/s", count / elapsed / baseline,
                                    0.8 if threads == 1 else None, ">="))
        cores = os.cpu_count() or 1
        for threads, timing in sorted(timings.items()):
            busy = (timing.connector_cpu + timing.server_cpu) / elapsed_by_threads[threads]
            rows.append(harness.Row(
                NAME, f"cores busy in the {threads}-thread snapshot: connector "
                f"{timing.connector_cpu / elapsed_by_threads[threads]:.2f} + server "
                f"{timing.server_cpu / elapsed_by_threads[threads]:.2f}",
                "the machine's cores", busy, cores, "cores", busy / cores,
            ))  # fmt: skip
        rows.append(harness.Row(NAME, "the 1-thread engine run as a whole (connect, snapshot, close the client)",
                                BASELINE, count / whole_runs[1], baseline, "docs/s", count / whole_runs[1] / baseline))
        rows.append(harness.Row(NAME, f"planning {planned} ranges ($sample on the server), share of a snapshot",
                                "the 2-thread snapshot that includes it", plan_s, elapsed_by_threads[2], "s",
                                plan_s / elapsed_by_threads[2]))
        interruption = _interruption(rs.uri, count, split, whole_runs[2], 3 if small else 7)
        rows += _latency_rows(rs.uri, count, split, 5)
    i = interruption
    rows.append(harness.Row(NAME, f"time lost to a stop at 90% and a resume ({i.twice:,} docs read twice)",
                            "one uninterrupted snapshot of the same collection", i.interrupted, i.uninterrupted, "s",
                            i.lost, 0.15, "<=", f"median of {i.rounds} rounds, {i.least:.2f}–{i.most:.2f}"))
    return rows


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
