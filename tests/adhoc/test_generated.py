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
from mongocdc_core.positions import Position
from mongocdc_core.replay import canonical, differences
from mongocdc_core.source import incremental
from mongocdc_core.source.incremental import (
    IncrementalSnapshotter,
    key_identity,
)

from .support import MemorySink, cluster_time, make_config, replay, wait_for

KEYS = 60
# The originals, before any example patches them (patches are undone only after the whole test).
_CLOSE_WATERMARK = IncrementalSnapshotter._close_watermark
_READ_CHUNK = incremental.read_chunk
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


@pytest.mark.parametrize("strategy", ["insert_insert", "insert_delete", "read_only"])
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    initial=st.sets(st.integers(0, KEYS - 1), min_size=5, max_size=KEYS),
    ops=st.lists(operation, min_size=10, max_size=120),
    chunk=st.integers(1, 17),
)
def test_records_rebuild_the_collection(
    mongo_uri: str, mongo_client: MongoClient[Any], monkeypatch: pytest.MonkeyPatch, initial: set[int],
    ops: list[tuple[str, int, int]], chunk: int, strategy: str,
) -> None:
    # The hardest cases for de-duplication: writes that land inside a window, after its low watermark
    # and before the chunk is read (aimed at the keys the chunk will read), and after the chunk was
    # read and before its window closes (aimed at the keys it read). With read_only watermarks the
    # latter are streamed before the window learns its high watermark, so the read is older than
    # events already dispatched: only de-duplication keeps it from undoing them.
    # Half the operations run in windows (a few per window), the rest on a concurrent thread.
    in_window = ops[::2]
    close, read = _CLOSE_WATERMARK, _READ_CHUNK

    def close_after_writes(self: IncrementalSnapshotter, window: Any) -> None:
        batch = [in_window.pop(0) for _ in range(min(3, len(in_window)))]
        chunk_keys = sorted(doc["_id"] for doc in window.buffer.values())
        if chunk_keys:  # aim at the documents this window just read
            batch = [(kind, chunk_keys[key % len(chunk_keys)], value) for kind, key, value in batch]
        _apply(mongo_client, db, batch)
        close(self, window)

    def read_between_writes(collection: Any, last: Any, condition: Any, size: int, session: Any = None) -> Any:
        batch = [in_window.pop(0) for _ in range(min(2, len(in_window)))]
        after = -1 if last is None else last[0]
        _apply(mongo_client, db, [(kind, min(KEYS - 1, after + 1 + key % size), value) for kind, key, value in batch])
        documents = read(collection, last, condition, size, session)
        if session is None or not documents:  # written watermarks: close_after_writes covers this case
            return documents
        batch = [in_window.pop(0) for _ in range(min(2, len(in_window)))]
        keys = sorted(doc["_id"] for doc in documents)
        _apply(mongo_client, db, [(kind, keys[key % len(keys)], value) for kind, key, value in batch])
        newest = mongo_client.local["oplog.rs"].find_one({"ns": f"{db}.items"}, sort=[("$natural", -1)])
        if newest is not None and newest["ts"] > session.operation_time:  # wait until the stream delivered them
            written = Position.from_timestamp(newest["ts"])
            wait_for(lambda: any(r.position >= written for r in list(sink.records)), timeout=30)
        return documents

    monkeypatch.setattr(IncrementalSnapshotter, "_close_watermark", close_after_writes)
    monkeypatch.setattr(incremental, "read_chunk", read_between_writes)
    sink = MemorySink()
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
