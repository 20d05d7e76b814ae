"""Failures: step-down, dropped connections, history loss, kill -9 of the engine process."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from pymongo import MongoClient

from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import FileOffsetStore, MemoryOffsetStore
from mongocdc_core.receiver import ProgressListener
from mongocdc_core.source.errors import HistoryLostError
from mongocdc_devstack.fixture import EmulatedReplicaSet
from tests.engine.engine_support import (
    Background,
    MemorySink,
    cluster_time,
    make_config,
    replay,
    run_engine,
    source_state,
    wait_for,
)

pytestmark = pytest.mark.fault


def _ids(sink: MemorySink) -> set[Any]:
    return {orjson.loads(v["after"])["_id"] for v in sink.values() if v["op"] in ("c", "r")}


def _run_with_fault(fresh_db: Any, mongo_uri: str, fault: Any) -> tuple[MemorySink, Engine]:
    fresh_db.warmup.insert_one({})  # a fresh emulator's oplog must not be empty (see requests.md)
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data"})
    offsets = MemoryOffsetStore()
    sink = MemorySink()
    engine = Engine(cfg, sink, offsets)
    bg = Background(engine).start()
    wait_for(lambda: offsets.load() is not None)
    writer_client = fresh_db.client
    for i in range(30):
        writer_client[fresh_db.name].a.insert_one({"_id": i})
        if i == 10:
            fault(writer_client)

    def done() -> bool:
        bg.check()
        return len(_ids(sink)) >= 30

    wait_for(done, timeout=60)
    bg.stop()
    return sink, engine


def test_primary_step_down_mid_stream_loses_nothing(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    def step_down(client: Any) -> None:
        try:
            client.admin.command("replSetStepDown", 1, force=True, secondaryCatchUpPeriodSecs=0)
        except Exception:  # the stepping-down primary closes connections, as mongod does
            pass

    sink, engine = _run_with_fault(fresh_db, mongo_uri, step_down)
    assert _ids(sink) == set(range(30))
    streaming = engine.metrics.streaming  # one loss of the primary, one election (as test_connection_metrics)
    assert (streaming.NumberOfDisconnects, streaming.NumberOfPrimaryElections) == (1, 1)


def test_dropped_connections_mid_stream_lose_nothing(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    def drop(client: Any) -> None:
        try:
            client.admin.command("mongocdcDropConnections")
        except Exception:  # our own connection may be among the dropped ones
            pass

    sink, engine = _run_with_fault(fresh_db, mongo_uri, drop)
    assert _ids(sink) == set(range(30))
    streaming = engine.metrics.streaming  # one loss, and the same primary (same term) answers again
    assert (streaming.NumberOfDisconnects, streaming.NumberOfPrimaryElections) == (1, 0)


def test_failing_getmore_is_retried_with_backoff(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    def fail_getmore(client: Any) -> None:
        client.admin.command(
            "configureFailPoint",
            "failCommand",
            mode={"times": 3},
            data={"failCommands": ["getMore", "aggregate"], "errorCode": 11602, "errorLabels": ["ResumableChangeStreamError"]},
        )

    try:
        sink, engine = _run_with_fault(fresh_db, mongo_uri, fail_getmore)
    finally:
        fresh_db.client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert _ids(sink) == set(range(30))
    assert engine.metrics.streaming.NumberOfDisconnects >= 1


def _lose_history(fresh_db: Any, mongo_uri: str, mode: str) -> tuple[Any, MemoryOffsetStore]:
    fresh_db.a.insert_many([{"_id": i} for i in range(3)])
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": mode})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.a.insert_one({"_id": 3})  # changed while the connector is stopped...
    fresh_db.a.insert_one({"_id": 4})
    now = fresh_db.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    fresh_db.client.admin.command("mongocdcTruncateOplog", before=now)  # ...and purged from the oplog
    return cfg, offsets


def test_history_lost_with_initial_stops_with_a_clear_message(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    cfg, offsets = _lose_history(fresh_db, mongo_uri, "initial")
    with pytest.raises(HistoryLostError) as info:
        run_engine(cfg, MemorySink(), offsets)
    text = str(info.value)
    assert "no longer in the oplog" in text and "snapshot.mode=initial" in text and "when_needed" in text


def test_history_lost_with_when_needed_takes_a_new_snapshot(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    cfg, offsets = _lose_history(fresh_db, mongo_uri, "when_needed")
    sink = MemorySink()
    summary = run_engine(cfg, sink, offsets)
    assert summary.snapshot_performed
    assert replay(sink.records, f"{fresh_db.name}.a") == source_state(fresh_db.a)


def test_history_lost_mid_stream_is_detected(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    """The oplog is purged past the reader's position while the engine is running."""
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "initial", "max.queue.size": 4, "max.batch.size": 2})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.a.insert_many([{"_id": i, "pad": "x" * 1000} for i in range(200)])
    sink = MemorySink()
    engine = Engine(cfg, sink, offsets)
    gate = threading.Event()
    original = sink.write

    def slow_write(records: Any) -> None:
        original(records)
        if not gate.is_set():
            gate.set()
            now = fresh_db.client.admin.command("hello")["$clusterTime"]["clusterTime"]
            fresh_db.a.insert_one({"_id": "last"})
            fresh_db.client.admin.command("mongocdcTruncateOplog", before=now)

    sink.write = slow_write  # type: ignore[method-assign]
    with pytest.raises(HistoryLostError, match="no longer in the oplog"):
        engine.run(stop_at=cluster_time(fresh_db.client))


_CHILD = textwrap.dedent(
    """
    import sys
    from mongocdc_core.config import ConnectorConfig
    from mongocdc_core.coordinator import Engine
    from mongocdc_core.offsets import FileOffsetStore
    from mongocdc_core.sinks.jsonl import JsonlSink
    cfg = ConnectorConfig.from_dict({
        "mongodb.connection.string": sys.argv[1], "topic.prefix": "srv",
        "collection.include.list": sys.argv[2] + "\\\\..*", "poll.interval.ms": "50",
        "cursor.max.await.time.ms": "100", "offset.flush.interval.ms": "100",
        "mongocdc.schemas.enable": "false", "max.batch.size": "16",
    })
    from bson import Timestamp
    sink = JsonlSink(sys.argv[3])
    print("ready", flush=True)
    stop_at = Timestamp(*map(int, sys.argv[5].split(":"))) if sys.argv[5] else None  # empty: until killed
    Engine(cfg, sink, FileOffsetStore(sys.argv[4])).run(stop_at=stop_at)
    sink.close()
    """
)


def _child(uri: str, db: str, out: Path, offsets: Path, stop_at: Any = None) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, uri, db, str(out), str(offsets), f"{stop_at.time}:{stop_at.inc}" if stop_at else ""],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _jsonl(out: Path, topic: str) -> list[tuple[bytes, bytes | None]]:
    path = out / f"{topic}.jsonl"
    if not path.exists():
        return []
    pairs = []
    for line in path.read_bytes().splitlines():
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError:  # a torn last line from the killed process
            continue
        value = item["value"]
        pairs.append((orjson.dumps(item["key"]), orjson.dumps(value) if value is not None else None))
    return pairs


def test_kill_9_mid_stream_then_restart_loses_nothing(fresh_db: Any, mongo_uri: str, emulator: Any, tmp_path: Path) -> None:
    from mongocdc_core.replay import Replayer, canonical

    out, offsets = tmp_path / "out", tmp_path / "offsets.json"
    fresh_db.a.insert_many([{"_id": i, "n": 0} for i in range(50)])
    proc = _child(mongo_uri, fresh_db.name, out, offsets)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    topic = f"srv.{fresh_db.name}.a"
    wait_for(lambda: len(_jsonl(out, topic)) >= 50, timeout=60)  # snapshot delivered
    for i in range(300):
        fresh_db.a.update_one({"_id": i % 50}, {"$inc": {"n": 1}})
        if i % 7 == 0:
            fresh_db.a.insert_one({"_id": 1000 + i})
        if i == 150:
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    stored = FileOffsetStore(offsets).load()
    assert stored is not None and stored.resume_token is not None

    restart = _child(mongo_uri, fresh_db.name, out, offsets, stop_at=cluster_time(fresh_db.client))
    assert restart.wait(120) == 0
    pairs = _jsonl(out, topic)
    rebuilt = Replayer().apply_all(pairs).documents(f"{fresh_db.name}.a")
    assert canonical(rebuilt) == source_state(fresh_db.a)
    inserted = {orjson.loads(orjson.loads(v)["after"])["_id"] for _, v in pairs if v and orjson.loads(v)["op"] == "c"}
    assert inserted == {1000 + i for i in range(0, 300, 7)}



def test_errors_max_retries_zero_fails_on_the_first_retriable_error(
    fresh_db: Any, mongo_uri: str, emulator: Any
) -> None:
    from mongocdc_core.source.errors import CdcError

    fresh_db.warmup.insert_one({})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data", "errors.max.retries": 0})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 2},  # pymongo resumes once by itself; the second failure reaches the engine
        data={"failCommands": ["aggregate", "getMore"], "errorCode": 11602, "errorLabels": ["ResumableChangeStreamError"]},
    )
    try:
        with pytest.raises(CdcError, match="errors.max.retries"):
            run_engine(cfg, MemorySink(), offsets)
    finally:
        fresh_db.client.admin.command("configureFailPoint", "failCommand", mode="off")


def test_unreachable_stream_restarts_after_the_retriable_wait(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    fresh_db.warmup.insert_one({})
    cfg = make_config(
        mongo_uri,
        fresh_db.name,
        **{"snapshot.mode": "no_data", "connect.max.attempts": 1, "retriable.restart.connector.wait.ms": 100},
    )
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.a.insert_many([{"_id": i} for i in range(5)])
    fresh_db.client.admin.command(
        "configureFailPoint",
        "failCommand",
        mode={"times": 6},  # more consecutive failures than connect.max.attempts allows
        data={"failCommands": ["aggregate", "getMore"], "errorCode": 11602, "errorLabels": ["ResumableChangeStreamError"]},
    )
    sink = MemorySink()
    try:
        run_engine(cfg, sink, offsets)
    finally:
        fresh_db.client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert _ids(sink) == set(range(5))


def test_unlimited_restarts_keep_retrying_while_mongodb_stays_down(
    tmp_path: Path, emulator: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """errors.max.retries=-1: restarts while MongoDB is down retry again instead of crashing."""
    server = EmulatedReplicaSet(dbpath=str(tmp_path / "db"), noop_interval=1.0).start()
    client: MongoClient[Any] = MongoClient(server.uri, serverSelectionTimeoutMS=20_000)
    try:
        client.shop.warmup.insert_one({})
        cfg = make_config(
            server.uri, "shop", **{
                "snapshot.mode": "no_data", "errors.max.retries": -1, "connect.max.attempts": 1,
                "retriable.restart.connector.wait.ms": 100, "mongodb.server.selection.timeout.ms": 300,
            },
        )
        offsets, sink = MemoryOffsetStore(), MemorySink()
        with caplog.at_level(logging.WARNING):
            bg = Background(Engine(cfg, sink, offsets)).start()
            wait_for(lambda: offsets.load() is not None)
            client.shop.a.insert_one({"_id": 1})
            wait_for(lambda: _ids(sink) == {1})
            server.stop()
            wait_for(lambda: sum("restart" in r.getMessage() for r in caplog.records) >= 3, timeout=60)
            bg.check()  # still running: every restart that found MongoDB down was retried
            server.start()
            client.shop.a.insert_one({"_id": 2})
            now = cluster_time(client)
            def caught_up() -> bool:
                bg.check()
                return _ids(sink) == {1, 2}

            wait_for(caught_up, timeout=60)
            summary = bg.stop()
        assert summary.events == 2 and offsets.load() is not None
        assert (last := offsets.load()) is not None and last.position is not None
        assert last.position.timestamp >= now
    finally:
        client.close()
        server.stop()


def test_history_lost_while_a_getmore_is_blocked_is_not_an_idle_stop(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    """A stream blocked on the server longer than until_idle is not idle; the purged position fails the run."""
    fresh_db.a.insert_one({"_id": 0})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "initial"})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets, stop_at=cluster_time(fresh_db.client))
    admin = fresh_db.client.admin
    admin.command(
        "configureFailPoint", "failCommand", mode={"times": 1},
        # The stream's first command (its aggregate, then a getMore) blocks for 3 s: the oplog is
        # purged past the stored position meanwhile, so the blocked stream has lost history.
        data={"failCommands": ["aggregate", "getMore"], "blockConnection": True, "blockTimeMS": 3000},
    )
    try:
        streaming = threading.Event()

        class Ready(ProgressListener):
            def streaming_started(self, position: Any) -> None:
                streaming.set()

        bg = Background(Engine(cfg, MemorySink(), offsets, progress=Ready()), until_idle=0.5).start()
        assert streaming.wait(30)
        fresh_db.a.insert_one({"_id": 1})
        fresh_db.a.insert_one({"_id": 2})
        admin.command("mongocdcTruncateOplog", before=cluster_time(fresh_db.client))
        with pytest.raises(HistoryLostError) as info:
            bg.wait()
    finally:
        admin.command("configureFailPoint", "failCommand", mode="off")
    text = str(info.value)
    assert "no longer in the oplog" in text and "snapshot.mode=initial" in text and "when_needed" in text


def _fail_next(admin: Any, commands: list[str], code: int) -> None:
    """The next of ``commands`` fails with ``code`` and no error labels (not resumable by label)."""
    admin.command(
        "configureFailPoint", "failCommand", mode={"times": 1},
        data={"failCommands": commands, "errorCode": code, "errorLabels": []},
    )


def test_fatal_getmore_error_is_one_clear_error(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    from mongocdc_core.source.errors import ChangeStreamFailedError

    fresh_db.warmup.insert_one({})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data"})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.a.insert_one({"_id": 1})
    _fail_next(fresh_db.client.admin, ["getMore", "aggregate"], 280)
    try:
        with pytest.raises(ChangeStreamFailedError) as info:
            run_engine(cfg, MemorySink(), offsets)
    finally:
        fresh_db.client.admin.command("configureFailPoint", "failCommand", mode="off")
    text = str(info.value)
    assert "280" in text and "ChangeStreamFatalError" in text and "\n" not in text


@pytest.mark.parametrize("code", [136, 286])
def test_history_lost_codes_resume_while_the_position_is_still_in_the_oplog(
    fresh_db: Any, mongo_uri: str, emulator: Any, code: int
) -> None:
    fresh_db.warmup.insert_one({})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data"})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    fresh_db.a.insert_many([{"_id": i} for i in range(5)])
    _fail_next(fresh_db.client.admin, ["getMore", "aggregate"], code)
    sink = MemorySink()
    try:
        run_engine(cfg, sink, offsets)
    finally:
        fresh_db.client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert _ids(sink) == set(range(5))


def test_initial_only_after_its_snapshot_is_complete_even_when_the_oplog_moved_on(
    fresh_db: Any, mongo_uri: str, emulator: Any
) -> None:
    cfg, offsets = _lose_history(fresh_db, mongo_uri, "initial_only")
    summary = run_engine(cfg, MemorySink(), offsets)
    assert summary.stopped_because == "snapshot_only" and not summary.snapshot_performed


def test_a_landing_file_ending_in_a_partial_line_is_repaired_by_the_streaming_restart(
    fresh_db: Any, mongo_uri: str, tmp_path: Path
) -> None:
    """What kill -9 leaves in the middle of a write: the restart cuts the partial line and delivers its
    record again, whole, so every event is in the file exactly once and every line parses."""
    from mongocdc_core.offsets import Offset
    from mongocdc_core.sinks.jsonl import JsonlSink

    fresh_db.a.insert_many([{"_id": i} for i in range(3)])
    cfg = make_config(mongo_uri, fresh_db.name)
    out, offsets = tmp_path / "out", FileOffsetStore(tmp_path / "offsets.json")
    sink = JsonlSink(out)
    run_engine(cfg, sink, offsets)  # snapshot and stream up to now: the offset is saved here
    sink.close()
    fresh_db.a.insert_many([{"_id": i, "pad": "p" * 300} for i in range(3, 8)])
    fresh_db.a.delete_one({"_id": 0})
    stop_at = cluster_time(fresh_db.client)

    # The records the crashed run was writing: the same run, from the same offset, into a scratch directory.
    stored = offsets.load()
    assert stored is not None
    scratch = JsonlSink(tmp_path / "scratch")
    run_engine(cfg, scratch, MemoryOffsetStore(Offset.from_json(stored.to_json())), stop_at=stop_at)
    scratch.close()
    topic = cfg.data_topic(fresh_db.name, "a")
    crashed = (tmp_path / "scratch" / f"{topic}.jsonl").read_bytes().splitlines(keepends=True)
    landing = out / f"{topic}.jsonl"
    before = landing.read_bytes()
    with open(landing, "ab") as fh:
        fh.write(crashed[0][: len(crashed[0]) // 2])  # killed halfway through its first line

    sink = JsonlSink(out)
    run_engine(cfg, sink, offsets, stop_at=stop_at)
    sink.close()
    content = landing.read_bytes()
    assert content.startswith(before) and content.endswith(b"\n")
    lines = [orjson.loads(line) for line in content[len(before):].splitlines()]  # every line parses
    ops = [(line["key"]["id"], (line["value"] or {}).get("op")) for line in lines]
    assert ops == [(str(i), "c") for i in range(3, 8)] + [("0", "d"), ("0", None)]  # each once, none torn
    assert [(line["key"]["id"], (line["value"] or {}).get("op")) for line in map(orjson.loads, crashed)] == ops
    pairs = _jsonl(out, topic)
    from mongocdc_core.replay import Replayer, canonical

    assert canonical(Replayer().apply_all(pairs).documents(f"{fresh_db.name}.a")) == source_state(fresh_db.a)


def test_a_resume_inside_the_driver_starts_after_the_events_taken_by_batch(fresh_db: Any, mongo_uri: str, emulator: Any) -> None:
    """The reader takes the rest of a server batch at once rather than event by event. pymongo's own
    resume (once, inside ``try_next``, after a resumable error) must still start after the last of
    them: every event exactly once, in order."""
    fresh_db.warmup.insert_one({})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data", "max.batch.size": 7})
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets, until_idle=0.3)  # pins the start
    fresh_db.a.insert_many([{"_id": i} for i in range(40)])
    admin = fresh_db.client.admin
    # The first getMore after the stream's first batch fails once: pymongo resumes by itself.
    admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data={
        "failCommands": ["getMore"], "errorCode": 11602, "errorLabels": ["ResumableChangeStreamError"]})
    try:
        sink = MemorySink()
        engine = Engine(cfg, sink, offsets)
        summary = engine.run(max_events=40)
    finally:
        admin.command("configureFailPoint", "failCommand", mode="off")
    assert summary.events == 40
    assert [orjson.loads(v["after"])["_id"] for v in sink.values()] == list(range(40))
    assert engine.metrics.streaming.NumberOfDisconnects == 0  # the driver resumed, not the reader
