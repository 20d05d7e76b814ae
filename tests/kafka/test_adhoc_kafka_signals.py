"""Ad hoc snapshots triggered through the Kafka signal channel of a running engine (real broker)."""

from __future__ import annotations

import threading
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer
from pymongo.database import Database

from mongocdc_core.coordinator import Engine
from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.positions import Position
from tests.adhoc.support import Background, MemorySink, engine_config, kinds, read_ids, wait_for


class _Streaming(ProgressListener):
    def __init__(self) -> None:
        self.started = threading.Event()

    def streaming_started(self, position: Position | None) -> None:
        self.started.set()


@pytest.mark.parametrize("strategy", ["insert_insert", "read_only"])
def test_kafka_signals_start_an_incremental_snapshot(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database[Any], strategy: str
) -> None:
    db = fresh_db.name
    fresh_db.items.insert_many([{"_id": i, "color": "blue" if i % 2 else "red"} for i in range(40)])
    topic = f"srv-signal-{db}"
    # read_only: no signaling collection at all, the connector writes nothing to MongoDB
    read_only = {"signal.data.collection": "", "signal.enabled.channels": "kafka"} if strategy == "read_only" else {}
    cfg = engine_config(mongo_uri, db, **{
        "signal.enabled.channels": "source,kafka", "signal.kafka.bootstrap.servers": kafka_bootstrap,
        "signal.kafka.topic": topic, "signal.kafka.groupId": f"g-{db}", "incremental.snapshot.chunk.size": 6,
        "incremental.snapshot.watermarking.strategy": strategy, **read_only,
    })
    sink = MemorySink()
    streaming = _Streaming()
    engine = Background(Engine(cfg, sink, MemoryOffsetStore(), progress=streaming)).start()
    try:
        wait_for(streaming.started.is_set, engine)
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        execute = {"type": "execute-snapshot", "data": {
            "data-collections": [f"{db}.items"], "type": "INCREMENTAL",
            "additional-conditions": [{"data-collection": f"{db}.items", "filter": "color='blue'"}],
        }}
        producer.produce(topic, key=b"wrong-key", value=orjson.dumps(execute))
        producer.produce(topic, key=b"srv", value=b"{not json")
        producer.produce(topic, key=b"srv", value=orjson.dumps(execute))
        assert producer.flush(30) == 0
        wait_for(lambda: "COMPLETED" in kinds(sink, "Incremental Snapshot"), engine, timeout=60)
    finally:
        engine.stop()
    assert read_ids(sink, f"{db}.items") == [i for i in range(40) if i % 2]
    assert ("signals" in fresh_db.list_collection_names()) is (strategy != "read_only")
    assert kinds(sink, "Signal") == ["REJECTED", "REJECTED"]  # wrong key, malformed JSON: skipped
