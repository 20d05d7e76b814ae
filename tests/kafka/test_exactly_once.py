"""Exactly-once without Kafka Connect: records and offsets commit in one Kafka transaction, so a
``read_committed`` consumer sees each event once, even when the connector is killed with SIGKILL."""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path

from pymongo.database import Database

from mongocdc_core.api import current_cluster_time
from mongocdc_core.coordinator import Engine
from mongocdc_core.events.records import Record
from mongocdc_core.offsets import Offset, open_offset_store
from mongocdc_core.offsets.kafka import KafkaOffsetStore
from mongocdc_core.positions import Position
from mongocdc_core.sinks.factory import open_sink
from mongocdc_core.sinks.kafka import KafkaSink
from tests.kafka.kafka_support import (
    ConnectorProcess,
    data_events,
    expected_events,
    make_config,
    read_topic,
    wait_for,
    write_config,
    write_load,
)


def test_batches_and_offsets_commit_together(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database, tmp_path: Path
) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"mongocdc.kafka.exactly.once": "true"})
    offsets_topic = f"eos-offsets-{uuid.uuid4().hex[:8]}"
    fresh_db["c"].insert_many([{"_id": i} for i in range(3)])
    sink = open_sink(f"kafka:{kafka_bootstrap}", cfg)
    assert isinstance(sink, KafkaSink) and sink.transactional
    store = open_offset_store(f"kafka:{kafka_bootstrap}/{offsets_topic}", cfg, sink)
    summary = Engine(cfg, sink, store).run(stop_at=current_cluster_time(cfg))  # after the inserts
    sink.close()
    store.close()
    assert summary.snapshot_documents == 3
    assert sink.metrics.NumberOfTransactionsCommitted >= 2

    topic = cfg.data_topic(fresh_db.name, "c")
    assert data_events(kafka_bootstrap, topic, committed=True) == [(0, "r"), (1, "r"), (2, "r")]
    stored = KafkaOffsetStore(kafka_bootstrap, offsets_topic, str(cfg.name)).load()
    assert stored is not None and stored.resume_token is not None and not stored.snapshot_in_progress


def test_kill_9_at_random_points_never_duplicates_or_loses(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database, tmp_path: Path
) -> None:
    rng = random.Random(20240611)
    cfg = make_config(
        mongo_uri,
        fresh_db.name,
        **{"mongocdc.kafka.exactly.once": "true", "max.batch.size": "64", "max.queue.size": "256"},
    )
    config_path = write_config(tmp_path / "connector.json", cfg)
    offsets = f"kafka:{kafka_bootstrap}/eos-offsets-{uuid.uuid4().hex[:8]}"
    connector = ConnectorProcess(config_path, f"kafka:{kafka_bootstrap}", offsets, tmp_path / "connector.log")
    coll = fresh_db["load"]
    coll.insert_one({"_id": -1})  # the snapshot has something to copy
    connector.start()
    rounds, per_round = 4, 150
    for r in range(rounds):
        ids = range(r * per_round, (r + 1) * per_round)
        writer = threading.Thread(target=write_load, args=(coll, ids))
        writer.start()
        time.sleep(rng.uniform(0.05, 1.2))
        connector.kill9()
        writer.join()
        connector.start()
    all_ids = range(rounds * per_round)
    topic = cfg.data_topic(fresh_db.name, "load")
    expected = [(-1, "r"), *expected_events(all_ids)]
    wait_for(
        lambda: len(data_events(kafka_bootstrap, topic, committed=True)) >= len(expected),
        timeout=90,
        interval=1.0,
        what="all events committed",
    )
    assert connector.terminate() == 0
    committed = data_events(kafka_bootstrap, topic, committed=True)
    assert sorted(committed) == sorted(expected), "read_committed must see every event exactly once"
    uncommitted = data_events(kafka_bootstrap, topic, committed=False)
    assert len(uncommitted) >= len(committed)  # aborted batches are in the log, hidden from read_committed


def test_close_commits_only_records_the_committed_offset_covers(kafka_bootstrap: str) -> None:
    """At close, an open transaction whose records lie after the committed offset is aborted (a restart
    produces them again); one holding only covered records (END, heartbeat) is committed."""
    cfg = make_config("mongodb://127.0.0.1:1/?replicaSet=rs0", "db", **{"mongocdc.kafka.exactly.once": "true"})
    offsets_topic = f"eos-offsets-{uuid.uuid4().hex[:8]}"
    topic = f"eos-close-{uuid.uuid4().hex[:8]}"

    def record(seconds: int, value: bytes) -> Record:
        return Record(topic, b'{"id":"1"}', value, Position(seconds, 1), "db.c", "c")

    sink = open_sink(f"kafka:{kafka_bootstrap}", cfg)
    store = open_offset_store(f"kafka:{kafka_bootstrap}/{offsets_topic}", cfg, sink)
    sink.write([record(10, b'{"n":1}')])
    store.save(Offset(resume_token={"_data": "82"}, position=Position(10, 1)))
    sink.write([record(10, b'{"n":2}')])  # covered by the committed offset: committed at close
    sink.close()
    sink = open_sink(f"kafka:{kafka_bootstrap}", cfg)
    store = open_offset_store(f"kafka:{kafka_bootstrap}/{offsets_topic}", cfg, sink)
    sink.write([record(11, b'{"n":3}')])  # after the committed offset: aborted at close
    sink.close()
    store.close()
    assert [v for _, _, v in read_topic(kafka_bootstrap, topic, committed=True)] == [b'{"n":1}', b'{"n":2}']
