"""Faults: the broker goes away mid-stream, the connector is killed with SIGKILL; nothing is lost."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

from pymongo.database import Database

from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import FileOffsetStore
from mongocdc_core.sinks.kafka import KafkaSink
from mongocdc_devstack.kafka_broker import KafkaBroker
from tests.engine.engine_support import Background
from tests.kafka.kafka_support import (
    ConnectorProcess,
    StreamingStarted,
    data_events,
    expected_events,
    make_config,
    wait_for,
    write_config,
    write_load,
)


def _per_key_in_order(events: list[tuple[int, str]]) -> bool:
    """Every document's create comes before its update (Kafka keeps a key's order)."""
    seen: dict[int, list[str]] = {}
    for doc_id, op in events:
        seen.setdefault(doc_id, []).append(op)
    return all(ops.index("c") < ops.index("u") for ops in seen.values() if "u" in ops and "c" in ops)


def test_broker_stopped_and_restarted_mid_stream_loses_nothing(
    kafka_broker: KafkaBroker, mongo_uri: str, fresh_db: Database, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    cfg = make_config(mongo_uri, fresh_db.name, **{"max.batch.size": "32", "max.queue.size": "64"})
    sink = KafkaSink.from_config(bootstrap, cfg)
    listener = StreamingStarted()
    engine = Engine(cfg, sink, FileOffsetStore(tmp_path / "offsets.json"), progress=listener)
    run = Background(engine).start()
    wait_for(lambda: listener.started.is_set() or run.error is not None)
    run.check()
    coll = fresh_db["c"]
    write_load(coll, range(0, 200))
    wait_for(lambda: engine.metrics.streaming.TotalNumberOfEventsSeen >= 300, what="first part streamed")

    kafka_broker.stop()
    try:
        writer = threading.Thread(target=write_load, args=(coll, range(200, 600)))
        writer.start()
        wait_for(lambda: sink.metrics.SinkBlocked, timeout=60, what="sink reports it is blocked")
        assert run.error is None
        writer.join()
    finally:
        kafka_broker.start()
    wait_for(lambda: engine.metrics.streaming.TotalNumberOfEventsSeen >= 900 or run.error is not None,
             timeout=90, what="all events streamed")
    run.stop()
    sink.close()

    health = sink.metrics.as_dict()
    assert not health["SinkBlocked"] and health["MilliSecondsBlocked"] > 0 and health["NumberOfBlockedPeriods"] >= 1
    events = data_events(bootstrap, cfg.data_topic(fresh_db.name, "c"), committed=False)
    assert set(events) == set(expected_events(range(600)))
    assert _per_key_in_order(events)


def test_until_idle_does_not_stop_while_blocked_on_a_kafka_outage(
    kafka_broker: KafkaBroker, mongo_uri: str, fresh_db: Database, tmp_path: Path
) -> None:
    """Time blocked on the broker is not idle: the run ends only after every queued event was delivered."""
    bootstrap = kafka_broker.bootstrap_servers
    cfg = make_config(mongo_uri, fresh_db.name, **{
        "snapshot.mode": "no_data", "max.batch.size": "16", "max.queue.size": "32", "offset.flush.interval.ms": "0",
    })
    sink = KafkaSink.from_config(bootstrap, cfg)
    listener = StreamingStarted()
    engine = Engine(cfg, sink, FileOffsetStore(tmp_path / "offsets.json"), progress=listener)
    run = Background(engine, until_idle=0.5).start()
    wait_for(lambda: listener.started.is_set() or run.error is not None)
    run.check()
    coll = fresh_db["c"]
    writing = threading.Event()
    written: list[int] = []

    def write() -> None:  # a steady trickle, so the stream is never idle before the outage
        while not writing.is_set():
            coll.insert_one({"_id": len(written)})
            written.append(len(written))
            time.sleep(0.02)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        wait_for(lambda: engine.metrics.streaming.TotalNumberOfEventsSeen >= 10 or run.error is not None)
        kafka_broker.stop()
        wait_for(lambda: sink.metrics.SinkBlocked or run.error is not None or run.summary is not None,
                 timeout=60, what="sink blocked")
        writing.set()
        writer.join()
        # Blocked for six times the idle bound with events queued: the run must still be going.
        wait_for(lambda: sink.metrics.as_dict()["MilliSecondsBlocked"] >= 3000 or run.summary is not None
                 or run.error is not None, timeout=60, what="sink blocked for 3 s")
        run.check()
        assert run.summary is None, f"the run stopped during the outage: {run.summary}"
    finally:
        writing.set()
        writer.join()
        kafka_broker.start()
    summary = run.wait(120)
    sink.close()
    assert summary.stopped_because == "idle" and summary.events == len(written)
    events = data_events(bootstrap, cfg.data_topic(fresh_db.name, "c"), committed=False)
    assert set(events) == {(i, "c") for i in written}


def test_kill_9_under_load_is_at_least_once(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database, tmp_path: Path
) -> None:
    rng = random.Random(7)
    cfg = make_config(mongo_uri, fresh_db.name, **{"max.batch.size": "64", "max.queue.size": "256"})
    config_path = write_config(tmp_path / "connector.json", cfg)
    offsets = f"kafka:{kafka_bootstrap}/alo-offsets-{uuid.uuid4().hex[:8]}"
    connector = ConnectorProcess(config_path, f"kafka:{kafka_bootstrap}", offsets, tmp_path / "connector.log")
    coll = fresh_db["load"]
    connector.start()
    rounds, per_round = 3, 150
    for r in range(rounds):
        writer = threading.Thread(target=write_load, args=(coll, range(r * per_round, (r + 1) * per_round)))
        writer.start()
        time.sleep(rng.uniform(0.05, 1.2))
        connector.kill9()
        writer.join()
        connector.start()
    expected = set(expected_events(range(rounds * per_round)))
    topic = cfg.data_topic(fresh_db.name, "load")
    wait_for(lambda: set(data_events(kafka_bootstrap, topic, committed=False)) >= expected,
             timeout=90, interval=1.0, what="every event delivered")
    assert connector.terminate() == 0
    events = data_events(kafka_bootstrap, topic, committed=False)
    assert set(events) == expected  # duplicates allowed (at-least-once), nothing missing, nothing extra
    assert _per_key_in_order(events)
