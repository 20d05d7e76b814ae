"""A transaction's END record arrives while the stream runs on, without waiting for another event."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pymongo import MongoClient

from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import MemoryOffsetStore
from tests.engine.engine_support import Background, MemorySink, make_config, run_engine, wait_for


@pytest.mark.parametrize("event_format", ["change_streams", "debezium_3x"])
def test_end_is_written_once_the_stream_has_passed_the_transaction(
    fresh_db: Any, mongo_client: MongoClient[Any], mongo_uri: str, event_format: str
) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{
        "provide.transaction.metadata": "true", "mongocdc.event.format": event_format, "snapshot.mode": "no_data",
    })
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)  # pins the start: what follows is streamed
    sink = MemorySink()
    run = Background(Engine(cfg, sink, offsets)).start()
    try:
        with mongo_client.start_session() as session, session.start_transaction():
            fresh_db.orders.insert_one({"_id": 1}, session=session)
            fresh_db.lines.insert_one({"_id": 1}, session=session)

        def statuses() -> list[str]:
            run.check()
            return [orjson.loads(r.value or b"{}").get("status") for r in sink.topic("srv.transaction")]

        # Nothing is written after the transaction: the END comes from the stream having passed it.
        wait_for(lambda: statuses() == ["BEGIN", "END"], timeout=60)
    finally:
        run.stop()
    assert statuses() == ["BEGIN", "END"]  # and the stop wrote no second END
