"""Snapshots stopped at a random point (SIGTERM or kill -9) resume with what is left.

The connector runs as users run it (``mongocdc run`` in its own process, JSON Lines sink, offset
file). Facts decide, read from the offset file the stopped process left: the restart delivers
exactly the documents the offsets do not cover (so after kill -9 only the ranges or chunks that
were in flight repeat), after SIGTERM nothing is delivered twice, nothing is ever lost, the
markers ``first``/``last`` stay where Debezium puts them, and for an ad hoc blocking snapshot
streaming resumes at the signal once the snapshot is complete.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from pymongo.database import Database

from mongocdc_core.offsets import Offset, SnapshotState
from mongocdc_core.source.incremental import IncrementalState
from mongocdc_core.source.ranges import IdRange, decode_key

REPO = Path(__file__).resolve().parents[2]
TOTAL, SPLIT, THREADS = 3000, 300, 3
HALF = TOTAL // 2
SIGNALS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="kill9")]
APP = "mongocdc-resume-test"


@contextmanager
def _paced(db: Database, block_ms: int = 100) -> Iterator[None]:
    """Every read of the connector under test (``find``/``getMore`` from its ``appName``) waits
    ``block_ms`` at the server, through mongod's ``failCommand`` fail point: a run of a few thousand
    documents then lasts seconds, so the stop lands inside the snapshot however fast the connector is."""
    admin = db.client.admin
    admin.command("configureFailPoint", "failCommand", mode="alwaysOn", data={
        "failCommands": ["find", "getMore"], "blockConnection": True, "blockTimeMS": block_ms, "appName": APP})
    try:
        yield
    finally:
        admin.command("configureFailPoint", "failCommand", mode="off")


def _with_app_name(uri: str) -> str:
    if "?" in uri:
        return f"{uri}&appName={APP}"
    return f"{uri}{'' if uri.partition('://')[2].count('/') else '/'}?appName={APP}"


def _config(tmp_path: Path, uri: str, db: str, **extra: str) -> Path:
    path = tmp_path / "connector.json"
    path.write_bytes(orjson.dumps({"name": "resume", "config": {
        "mongodb.connection.string": _with_app_name(uri),
        "topic.prefix": "srv",
        "collection.include.list": f"{db}\\..*",
        "snapshot.mode": "initial_only",
        "snapshot.max.threads": str(THREADS),
        "snapshot.fetch.size": "50",
        "mongocdc.snapshot.split.size": str(SPLIT),
        "offset.flush.interval.ms": "600000",  # only finished ranges and stops record progress
        "mongocdc.schemas.enable": "false",
        "poll.interval.ms": "50",
        "cursor.max.await.time.ms": "100",
        **extra,
    }}))
    return path


def _run(config: Path, out: Path, offsets: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", f"jsonl:{out}",
         "--offsets", str(offsets), "--no-progress", *extra],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def _wait_streaming(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert "streaming" in line, line + (proc.stderr.read().decode() if proc.stderr else "")


def _values(path: Path) -> list[dict[str, Any]]:
    """The data events of a landing file (tombstones left out), in delivery order; a last line torn by
    kill -9 is left out (the sink cuts it off when it opens the file again)."""
    if not path.exists():
        return []
    complete = path.read_bytes().rpartition(b"\n")[0]
    return [v for line in complete.splitlines() if (v := orjson.loads(line)["value"]) is not None]


def _identity(coll: str, value: Any) -> bytes:
    return orjson.dumps([coll, value])


def _read_ids(values: list[dict[str, Any]], coll: str = "big") -> list[bytes]:
    return [_identity(coll, orjson.loads(v["after"])["_id"]) for v in values if v["op"] == "r"]


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _interrupt(proc: subprocess.Popen[bytes], landing: Path, threshold: int, sig: signal.Signals) -> None:
    """Deliver ``sig`` once ``landing`` holds ``threshold`` records; a SIGTERM must stop cleanly."""
    deadline = time.monotonic() + 120
    while _lines(landing) < threshold and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, f"the run ended before the stop at {threshold} records: make it larger"
    os.kill(proc.pid, sig)
    code = proc.wait(60)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if sig == signal.SIGTERM:
        assert code == 0 and "Traceback" not in stderr, stderr


def _stored(offsets: Path) -> Offset:
    return Offset.from_json(orjson.loads(offsets.read_bytes()))


def _covered(db: Database, state: SnapshotState) -> Counter[bytes]:
    """The documents the snapshot progress says were delivered and flushed (identities, each once)."""

    def ids(coll: str, id_range: IdRange) -> Counter[bytes]:
        return Counter(_identity(coll, d["_id"]) for d in db[coll].find(id_range.query(), {"_id": 1}))

    covered: Counter[bytes] = Counter()
    for namespace in state.completed:
        covered += ids(namespace.partition(".")[2], IdRange())
    for namespace, entries in state.parts.items():
        coll = namespace.partition(".")[2]
        for entry in entries:
            id_range = IdRange.from_json(entry["range"])
            if entry.get("done"):
                covered += ids(coll, id_range)
            elif entry.get("after") is not None:
                covered += ids(coll, id_range) - ids(coll, id_range.after(decode_key(entry["after"])))
    return covered


def _now(db: Database) -> str:
    ts = db.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    return f"{ts.time}:{ts.inc}"


def _seed_big(db: Database) -> Counter[bytes]:
    """Half integer, half string ``_id`` values: ranges cross a type bracket."""
    ids: list[Any] = [*range(HALF), *(f"s{i:05d}" for i in range(HALF))]
    db.big.insert_many([{"_id": i, "pad": "x" * 200} for i in ids])
    return Counter(_identity("big", i) for i in ids)


def _markers(values: list[dict[str, Any]]) -> list[str]:
    return [v["source"]["snapshot"] for v in values if v["op"] == "r"]


def _check_resume(
    expected: Counter[bytes], first: list[bytes], second: list[bytes], covered: Counter[bytes], sig: signal.Signals
) -> None:
    """The facts every resumed snapshot must show."""
    assert first and second, "the interruption must fall inside the snapshot"
    assert Counter(second) == expected - covered, "the restart must deliver exactly what the offsets do not cover"
    assert covered <= Counter(first), "the offsets cover a record that was never delivered"
    if sig == signal.SIGTERM:
        assert Counter(first) == covered, "after a graceful stop the offsets cover everything delivered"
        assert Counter(first + second) == expected, "each document exactly once across a graceful stop"
    else:
        assert set(first + second) == set(expected), "a document was lost"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("sig", SIGNALS)
def test_initial_snapshot_interrupted_at_a_random_point_resumes(
    fresh_db: Database, mongo_uri: str, tmp_path: Path, sig: signal.Signals, seed: int
) -> None:
    expected = _seed_big(fresh_db)
    config, out, offsets = _config(tmp_path, mongo_uri, fresh_db.name), tmp_path / "out", tmp_path / "offsets.json"
    landing = out / f"srv.{fresh_db.name}.big.jsonl"
    with _paced(fresh_db):
        _interrupt(_run(config, out, offsets), landing, random.Random(seed).randint(TOTAL // 10, TOTAL * 9 // 10), sig)
    stored = _stored(offsets)
    assert stored.snapshot is not None and stored.snapshot.running
    covered = _covered(fresh_db, stored.snapshot)
    first = _values(landing)

    restart = _run(config, out, offsets)
    assert restart.wait(180) == 0, restart.stderr.read().decode() if restart.stderr else ""
    second = _values(landing)[len(first):]
    _check_resume(expected, _read_ids(first), _read_ids(second), covered, sig)
    assert _markers(second)[-1] == "last" and _markers(second).count("last") == 1
    if sig == signal.SIGTERM:
        markers = _markers(first + second)
        assert markers[0] == "first" and markers.count("first") == 1
        assert set(markers[1:-1]) == {"true"}  # one collection: no *_in_data_collection
    assert _stored(offsets).snapshot is None


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_blocking_snapshot_interrupted_at_a_random_point_resumes_then_streams_on(
    fresh_db: Database, mongo_uri: str, tmp_path: Path, sig: signal.Signals
) -> None:
    db = fresh_db.name
    expected = _seed_big(fresh_db) + Counter(_identity("small", i) for i in range(10))
    fresh_db.small.insert_many([{"_id": i} for i in range(10)])
    config = _config(tmp_path, mongo_uri, db, **{"snapshot.mode": "no_data", "signal.data.collection": f"{db}.signals"})
    out, offsets = tmp_path / "out", tmp_path / "offsets.json"
    files = {coll: out / f"srv.{db}.{coll}.jsonl" for coll in ("big", "small", "later")}
    proc = _run(config, out, offsets)
    _wait_streaming(proc)
    with _paced(fresh_db):
        fresh_db.signals.insert_one({"type": "execute-snapshot", "data": {
            "type": "blocking", "data-collections": [f"{db}.big", f"{db}.small"]}})
        # Written after the signal: streamed only once the snapshot is complete, and exactly once.
        fresh_db.later.insert_many([{"_id": i} for i in range(20)])
        fresh_db.big.update_many({"_id": {"$in": [0, 7, "s00003"]}}, {"$set": {"changed": True}})
        _interrupt(proc, files["big"], random.Random(int(sig)).randint(TOTAL // 10, TOTAL * 8 // 10), sig)
    stored = _stored(offsets)
    assert stored.blocking is not None and stored.blocking.running and stored.snapshot is None
    assert stored.blocking.collections == [f"{db}.big", f"{db}.small"]
    covered = _covered(fresh_db, stored.blocking)
    before = {coll: _values(path) for coll, path in files.items()}
    assert {v["op"] for values in before.values() for v in values} == {"r"}, "streaming stays paused meanwhile"
    assert not before["later"]

    restart = _run(config, out, offsets, "--stop-at", _now(fresh_db))
    assert restart.wait(180) == 0, restart.stderr.read().decode() if restart.stderr else ""
    after = {coll: _values(path)[len(before[coll]):] for coll, path in files.items()}
    first = [i for coll in ("big", "small") for i in _read_ids(before[coll], coll)]
    second = [i for coll in ("big", "small") for i in _read_ids(after[coll], coll)]
    _check_resume(expected, first, second, covered, sig)
    # Streaming resumed where it paused: after the last read, the changes written after the signal, once.
    ops = [v["op"] for v in after["big"]]
    assert ops == ["r"] * ops.count("r") + ["u"] * 3
    assert [orjson.loads(v["after"])["_id"] for v in after["later"]] == list(range(20))
    markers = Counter(_markers(before["big"] + before["small"] + after["big"] + after["small"]))
    assert markers["last"] == 1
    if sig == signal.SIGTERM:
        assert {k: markers[k] for k in ("first", "first_in_data_collection", "last_in_data_collection")} == {
            "first": 1, "first_in_data_collection": 1, "last_in_data_collection": 1}
    assert _stored(offsets).blocking is None


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS)
def test_incremental_snapshot_interrupted_at_a_random_point_resumes_by_chunk(
    fresh_db: Database, mongo_uri: str, tmp_path: Path, sig: signal.Signals
) -> None:
    db = fresh_db.name
    fresh_db.big.insert_many([{"_id": i, "pad": "x" * 200} for i in range(TOTAL)])
    config = _config(tmp_path, mongo_uri, db, **{
        "snapshot.mode": "no_data", "signal.data.collection": f"{db}.signals",
        "incremental.snapshot.chunk.size": "40", "offset.flush.interval.ms": "200",
    })
    out, offsets = tmp_path / "out", tmp_path / "offsets.json"
    landing = out / f"srv.{db}.big.jsonl"
    proc = _run(config, out, offsets)
    _wait_streaming(proc)
    with _paced(fresh_db, block_ms=20):
        fresh_db.signals.insert_one({"type": "execute-snapshot", "data": {"data-collections": [f"{db}.big"]}})
        _interrupt(proc, landing, random.Random(int(sig) + 1).randint(TOTAL // 10, TOTAL * 8 // 10), sig)
    stored = _stored(offsets)
    first = [orjson.loads(v["after"])["_id"] for v in _values(landing)]
    if stored.incremental is not None:
        (last,) = IncrementalState.from_json(stored.incremental).last_keys.get(f"{db}.big", (-1,))
    else:  # the signal itself was not recorded yet: the restart reads it again
        last = -1
    assert last < TOTAL - 1

    # The restart runs until the snapshot delivered the rest (its watermarks come after any stop_at
    # taken now), then stops gracefully.
    restart = _run(config, out, offsets)
    _wait_streaming(restart)
    _interrupt(restart, landing, len(first) + TOTAL - last - 1, signal.SIGTERM)
    second = [orjson.loads(v["after"])["_id"] for v in _values(landing)[len(first):]]
    assert second == list(range(last + 1, TOTAL)), "the restart continues with the chunk after the recorded one"
    assert first[: last + 1] == list(range(last + 1))  # the recorded chunks were delivered before
    if sig == signal.SIGTERM:
        assert first == list(range(last + 1)), "a graceful stop records every chunk it delivered"
    assert _stored(offsets).incremental is None
