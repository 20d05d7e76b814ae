"""mongocdc against the real Debezium MongoDB connector on the same data (the baseline).

Both connectors run as processes of their own against one emulated replica set (a third process):
Debezium embedded with JsonConverter (``tests/compat/debezium``, built by ``make setup``, ``-Xmx512m``)
and ``mongocdc run`` with the jsonl sink, in ``mongocdc.event.format=debezium_3x`` (the same bytes)
and in the default format. Each runs twice, resuming from its offsets:

1. snapshot: N documents copied (``snapshot.mode=initial``);
2. catch-up streaming: M changes (inserts and updates) written while no connector ran, then read.

Rates come from the records themselves (snapshot reads carry their read time, every record its
processing time in the envelope's ``ts_ms``), so JVM and interpreter start-up are left out; CPU
seconds and peak RSS are the processes' own (``wait4``), start-up included. Prints mongocdc/Debezium
ratios: docs/s and events/s (higher is better for mongocdc), CPU seconds and peak RSS (lower is better).
``MONGOCDC_BENCH_SMALL=1`` runs a small size.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bson import Decimal128, Int64, ObjectId, Timestamp
from pymongo import MongoClient
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mongocdc_devstack.fixture import EmulatedReplicaSet  # noqa: E402
from tests.compat.debezium import (  # noqa: E402
    VERSIONS,
    DebeziumRecord,
    DebeziumRun,
    PeakRss,
    missing,
    wait_with_usage,
)

SMALL = os.environ.get("MONGOCDC_BENCH_SMALL") == "1"
N_DOCS = 3_000 if SMALL else 30_000
N_CHANGES = 3_000 if SMALL else 30_000
PREFIX = "bench"
DB = "bench"


def _document(rng: random.Random, i: int) -> dict[str, Any]:
    return {
        "_id": ObjectId(),
        "n": i,
        "name": f"customer {rng.randrange(1_000_000)}",
        "email": f"user{i}@example.org",
        "visits": Int64(rng.randrange(1 << 40)),
        "score": rng.random() * 100,
        "price": Decimal128(f"{rng.randrange(10_000)}.{rng.randrange(100):02d}"),
        "created": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=rng.randrange(10_000_000)),
        "address": {"street": f"{rng.randrange(999)} Main St", "city": "Springfield", "zip": "12345"},
        "tags": [rng.choice(["vip", "new", "churn", "beta"]) for _ in range(rng.randrange(4))],
        "active": rng.random() < 0.8,
    }


def _cluster_time(client: MongoClient[Any]) -> Timestamp:
    ts = client.admin.command("hello")["$clusterTime"]["clusterTime"]
    assert isinstance(ts, Timestamp)
    return ts


@dataclass
class Phase:
    """One run of one connector: how many records it produced and how fast, and what it cost."""

    items: int
    seconds: float
    cpu_seconds: float
    peak_rss_bytes: int

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("inf")


def _span(payloads: list[dict[str, Any]], *, reads: bool) -> float:
    """Seconds between the first and the last record (read time for reads, processing time otherwise)."""
    if reads:
        stamps = [p["source"]["ts_us"] / 1e6 for p in payloads]
    else:
        stamps = [p["ts_ms"] / 1e3 for p in payloads]
    return max(stamps) - min(stamps)


def _data_payloads(values: list[bytes | None], op: str) -> list[dict[str, Any]]:
    out = []
    for value in values:
        if value is None:
            continue
        parsed = json.loads(value)
        payload = parsed.get("payload", parsed) if isinstance(parsed, dict) else parsed
        if payload.get("op") == op or (op != "r" and payload.get("op") in ("c", "u")):
            out.append(payload)
    return out


class Debezium:
    def __init__(self, version: str, uri: str, workdir: Path) -> None:
        self.version = version
        self.workdir = workdir
        self.props = {
            "mongodb.connection.string": uri,
            "topic.prefix": PREFIX,
            "collection.include.list": f"{DB}\\.items,{DB}_probe\\..*",
            "snapshot.mode": "initial",
            "converter.schemas.enable": "true",
        }
        self.topic = f"{PREFIX}.{DB}.items"
        self.probe_topic = f"{PREFIX}.{DB}_probe.probe"

    def snapshot(self, client: MongoClient[Any]) -> Phase:
        probes = client[f"{DB}_probe"].probe
        counter = iter(range(1_000_000))
        with DebeziumRun(self.version, self.workdir, self.props, name="snapshot") as run:
            run.wait_for(lambda rs: any(b'"snapshot":"last"' in (r.value or b"") for r in rs), "the last read")
            run.wait_for(lambda rs: any(r.topic == self.probe_topic for r in rs), "a streamed probe",
                         tick=lambda: probes.insert_one({"_id": next(counter)}))
            records = run.stop()
            assert run.usage is not None
            reads = _data_payloads([r.value for r in records if r.topic == self.topic], "r")
            return Phase(len(reads), _span(reads, reads=True), run.usage.cpu_seconds, run.usage.peak_rss_bytes)

    def catch_up(self, changes: int) -> Phase:
        def streamed(records: list[DebeziumRecord]) -> int:
            return sum(1 for r in records if r.topic == self.topic and r.value is not None)

        with DebeziumRun(self.version, self.workdir, self.props, name="stream") as run:
            records = run.wait_for(lambda rs: streamed(rs) >= changes, f"{changes} streamed events")
            records = run.stop()
            assert run.usage is not None
            events = _data_payloads([r.value for r in records if r.topic == self.topic], "c")
            return Phase(len(events), _span(events, reads=False), run.usage.cpu_seconds, run.usage.peak_rss_bytes)


class Mongocdc:
    def __init__(self, uri: str, workdir: Path, event_format: str) -> None:
        self.workdir = workdir / event_format
        self.workdir.mkdir(parents=True)
        self.config = self.workdir / "connector.json"
        self.config.write_text(json.dumps({"name": "bench", "config": {
            "mongodb.connection.string": uri,
            "topic.prefix": PREFIX,
            "collection.include.list": f"{DB}\\.items",
            "snapshot.mode": "initial",
            "mongocdc.event.format": event_format,
            "mongocdc.schemas.enable": "true",
        }}))

    def _run(self, name: str, stop_at: Timestamp) -> tuple[list[dict[str, Any]], float, int]:
        sink = self.workdir / name
        command = [str(ROOT / ".venv" / "bin" / "mongocdc"), "run", "--config", str(self.config),
                   "--sink", f"jsonl:{sink}", "--offsets", str(self.workdir / "offsets.json"),
                   "--stop-at", f"{stop_at.time}:{stop_at.inc}", "--log-level", "WARNING"]
        errors = self.workdir / f"{name}.stderr"
        with errors.open("wb") as stderr:
            process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
            usage = wait_with_usage(process, PeakRss(process.pid))
        if process.returncode != 0:
            raise SystemExit(f"mongocdc run failed: {errors.read_text()[-4000:]}")
        values: list[bytes | None] = []
        topic_file = sink / f"{PREFIX}.{DB}.items.jsonl"
        if topic_file.exists():
            for line in topic_file.read_bytes().splitlines():
                value = json.loads(line)["value"]
                values.append(json.dumps(value).encode() if value is not None else None)
        payloads = [json.loads(v) for v in values if v is not None]
        payloads = [p.get("payload", p) for p in payloads]
        return payloads, usage.cpu_seconds, usage.peak_rss_bytes

    def snapshot(self, stop_at: Timestamp) -> Phase:
        payloads, cpu, rss = self._run("snapshot", stop_at)
        reads = [p for p in payloads if p["op"] == "r"]
        return Phase(len(reads), _span(reads, reads=True), cpu, rss)

    def catch_up(self, stop_at: Timestamp) -> Phase:
        payloads, cpu, rss = self._run("stream", stop_at)
        events = [p for p in payloads if p["op"] in ("c", "u")]
        return Phase(len(events), _span(events, reads=False), cpu, rss)


def main() -> None:
    console = Console()
    version = VERSIONS[-1]
    reason = missing(version)
    if reason is not None:
        raise SystemExit(f"bench_debezium: {reason}")
    rng = random.Random(7)
    with tempfile.TemporaryDirectory(prefix="bench-debezium-") as tmp, \
            EmulatedReplicaSet(in_process=False, noop_interval=1.0, oplog_size_mb=1024) as rs:
        workdir = Path(tmp)
        client: MongoClient[Any] = MongoClient(rs.uri)
        items = client[DB].items
        for start in range(0, N_DOCS, 1000):
            items.insert_many([_document(rng, i) for i in range(start, min(N_DOCS, start + 1000))])
        debezium = Debezium(version, rs.uri, workdir / "debezium")
        mongocdc = {fmt: Mongocdc(rs.uri, workdir, fmt) for fmt in ("debezium_3x", "change_streams")}
        console.print(f"snapshot of {N_DOCS} documents, then {N_CHANGES} changes caught up (Debezium {version})")
        snap = {"Debezium": debezium.snapshot(client)}
        after_load = _cluster_time(client)
        for fmt, connector in mongocdc.items():
            snap[fmt] = connector.snapshot(after_load)
        ids = [d["_id"] for d in items.find({}, {"_id": 1}).limit(N_CHANGES // 2)]
        for i in range(0, N_CHANGES - len(ids), 1000):
            items.insert_many([_document(rng, N_DOCS + i + j) for j in range(min(1000, N_CHANGES - len(ids) - i))])
        for doc_id in ids:
            items.update_one({"_id": doc_id}, {"$inc": {"n": 1}, "$set": {"touched": True}})
        after_changes = _cluster_time(client)
        stream = {"Debezium": debezium.catch_up(N_CHANGES)}
        for fmt, connector in mongocdc.items():
            stream[fmt] = connector.catch_up(after_changes)
        client.close()

    table = Table(title="mongocdc / Debezium (higher rate, lower CPU and memory are better for mongocdc)")
    for column in ("measure", "Debezium", "mongocdc debezium_3x", "ratio", "mongocdc default", "ratio"):
        table.add_column(column, justify="right")

    def row(name: str, phases: dict[str, Phase], attr: str, fmt: str) -> None:
        base = getattr(phases["Debezium"], attr)
        cells = [name, fmt.format(base)]
        for key in ("debezium_3x", "change_streams"):
            value = getattr(phases[key], attr)
            cells += [fmt.format(value), f"{value / base:.2f}" if base else "-"]
        table.add_row(*cells)

    row("snapshot docs/s", snap, "rate", "{:,.0f}")
    row("snapshot CPU s", snap, "cpu_seconds", "{:.2f}")
    row("snapshot peak RSS MiB", {k: Phase(v.items, v.seconds, v.cpu_seconds, v.peak_rss_bytes // 2**20)
                                  for k, v in snap.items()}, "peak_rss_bytes", "{:,}")
    row("catch-up events/s", stream, "rate", "{:,.0f}")
    row("catch-up CPU s", stream, "cpu_seconds", "{:.2f}")
    row("catch-up peak RSS MiB", {k: Phase(v.items, v.seconds, v.cpu_seconds, v.peak_rss_bytes // 2**20)
                                  for k, v in stream.items()}, "peak_rss_bytes", "{:,}")
    console.print(table)
    counts = {k: (snap[k].items, stream[k].items) for k in snap}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"the connectors saw different amounts of data: {counts}")


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"bench_debezium: {time.monotonic() - started:.0f} s")
