"""No ghosts in Kafka: a re-snapshot reads its topic back (``read_committed``) and deletes the keys gone
from the source, in exactly-once mode too (the read-back sees what the open transaction holds only
after it committed)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pymongo.database import Database

from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import open_offset_store
from mongocdc_core.replay import Replayer, canonical
from mongocdc_core.sinks.factory import open_sink
from tests.engine.engine_support import cluster_time
from tests.kafka.kafka_support import make_config, read_topic

pytestmark = pytest.mark.fault


@pytest.mark.parametrize("exactly_once", [False, True], ids=["idempotent", "exactly-once"])
def test_a_re_snapshot_deletes_the_keys_gone_from_the_source_in_kafka(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database[Any], emulator: Any, tmp_path: Path, exactly_once: bool
) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{
        "snapshot.mode": "when_needed", "mongocdc.snapshot.delete.missing.keys": "true",
        "mongocdc.kafka.exactly.once": str(exactly_once).lower(), "max.batch.size": 4,
    })
    offsets_spec = f"kafka:{kafka_bootstrap}/offsets-{uuid.uuid4().hex[:8]}"
    fresh_db.a.insert_many([{"_id": i, "n": i} for i in range(20)])

    def run() -> None:
        sink = open_sink(f"kafka:{kafka_bootstrap}", cfg)
        offsets = open_offset_store(offsets_spec, cfg, sink)
        try:
            Engine(cfg, sink, offsets).run(stop_at=cluster_time(fresh_db.client))
        finally:
            sink.close()
            offsets.close()

    run()
    fresh_db.a.delete_many({"_id": {"$in": [2, 7, 19]}})
    fresh_db.a.insert_one({"_id": 50})
    fresh_db.client.admin.command("mongocdcTruncateOplog", before=cluster_time(fresh_db.client))
    run()
    topic = cfg.data_topic(fresh_db.name, "a")
    pairs = [(k, v) for _, k, v in read_topic(kafka_bootstrap, topic, committed=True)]
    rebuilt = canonical(Replayer().apply_all(pairs).documents(f"{fresh_db.name}.a"))
    assert rebuilt == canonical(fresh_db.a.find())
    assert sum(v is None for _, v in pairs) == 3  # one tombstone per deleted ghost
