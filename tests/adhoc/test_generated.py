"""Generated: random concurrent writes during an incremental snapshot; the records rebuild the source."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from bson import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pymongo import MongoClient

from mongocdc_core.api import incremental_snapshot_collection, stream_window
from mongocdc_core.replay import canonical, differences
from mongocdc_core.source.incremental import (
    IncrementalSnapshotter,
    key_identity,
)

from .support import MemorySink, cluster_time, make_config, replay

KEYS = 60
operation = st.tuples(
    st.sampled_from(["insert", "update", "replace", "delete", "unset"]),
    st.integers(0, KEYS - 1),
    st.integers(-1000, 1000),
)


def _apply(client: MongoClient[Any], db: str, ops: list[tuple[str, int, int]]) -> None:
    items = client[db].items
    for kind, key, value in ops:
        if kind == "insert":
            items.update_one({"_id": key}, {"$setOnInsert": {"v": value, "tags": [value]}}, upsert=True)
        elif kind == "update":
            items.update_one({"_id": key}, {"$set": {"v": value, "nested.x": value}, "$push": {"tags": value}})
        elif kind == "replace":
            items.replace_one({"_id": key}, {"r": value}, upsert=True)
        elif kind == "unset":
            items.update_one({"_id": key}, {"$unset": {"v": ""}})
        else:
            items.delete_one({"_id": key})


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    initial=st.sets(st.integers(0, KEYS - 1), min_size=5, max_size=KEYS),
    ops=st.lists(operation, min_size=10, max_size=120),
    chunk=st.integers(1, 17),
    strategy=st.sampled_from(["insert_insert", "insert_delete"]),
)
def test_records_rebuild_the_collection(
    mongo_uri: str, mongo_client: MongoClient[Any], monkeypatch: pytest.MonkeyPatch, initial: set[int],
    ops: list[tuple[str, int, int]], chunk: int, strategy: str,
) -> None:
    # The hardest case for de-duplication: writes that land after a chunk was read and before its
    # window closes. Half the operations run there (a few per window), the rest on a concurrent thread.
    in_window = ops[::2]
    close = IncrementalSnapshotter._close_watermark

    def close_after_writes(self: IncrementalSnapshotter, window: Any) -> None:
        batch = [in_window.pop(0) for _ in range(min(3, len(in_window)))]
        chunk_keys = sorted(doc["_id"] for doc in window.buffer.values())
        if chunk_keys:  # aim at the documents this window just read
            batch = [(kind, chunk_keys[key % len(chunk_keys)], value) for kind, key, value in batch]
        _apply(mongo_client, db, batch)
        close(self, window)

    monkeypatch.setattr(IncrementalSnapshotter, "_close_watermark", close_after_writes)
    db = f"gen_{abs(hash((tuple(sorted(initial)), tuple(ops), chunk, strategy))) % 10**10}"
    mongo_client.drop_database(db)
    try:
        mongo_client[db].create_collection("items", changeStreamPreAndPostImages={"enabled": True})
        mongo_client[db].items.insert_many([{"_id": k, "v": k, "tags": []} for k in sorted(initial)])
        cfg = make_config(mongo_uri, db, **{
            "incremental.snapshot.chunk.size": chunk,
            "incremental.snapshot.watermarking.strategy": strategy,
            "capture.mode.full.update.type": "post_image",
        })
        sink = MemorySink()
        writer = threading.Thread(target=_apply, args=(mongo_client, db, ops[1::2]))
        writer.start()
        try:
            result = incremental_snapshot_collection(cfg, f"{db}.items", sink)
        finally:
            writer.join()
        _apply(mongo_client, db, in_window)  # whatever the windows did not take
        # the changes after the snapshot's end come from a stream slice that starts right after it
        assert result.end_position is not None
        end = cluster_time(mongo_client)
        start = Timestamp(result.end_position.seconds, result.end_position.increment + 1)
        if (end.time, end.inc) >= (start.time, start.inc):
            stream_window(cfg, f"{db}.items", start, Timestamp(end.time, end.inc + 1), sink)

        source = list(mongo_client[db].items.find())
        rebuilt = replay(sink.records, f"{db}.items")
        assert canonical(rebuilt) == canonical(source), differences(source, rebuilt)
        captured = {key_identity(d["_id"]) for d in rebuilt}
        assert {key_identity(d["_id"]) for d in source} <= captured  # no key is missing
    finally:
        mongo_client.drop_database(db)
