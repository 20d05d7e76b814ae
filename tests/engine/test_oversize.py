"""cursor.oversize.handling.mode: fail, skip (server-side $bsonSize match), split (reassembled)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.source.errors import OversizeEventError
from tests.engine.engine_support import MemorySink, make_config, run_engine

BIG = "x" * (9 * 1024 * 1024)  # pre-image + post-image of one update exceed the 16 MiB event limit


@pytest.fixture
def big_update(fresh_db: Any, mongo_uri: str) -> Any:
    """A collection with pre/post images and a pinned offset before one oversized update event."""
    fresh_db.create_collection("a", changeStreamPreAndPostImages={"enabled": True})
    fresh_db.a.insert_one({"_id": "big", "blob": BIG, "n": 0})

    def prepare(mode: str, **props: Any) -> tuple[Any, MemoryOffsetStore]:
        cfg = make_config(
            mongo_uri,
            fresh_db.name,
            **{
                "snapshot.mode": "no_data",
                "capture.mode": "change_streams_update_full_with_pre_image",
                "cursor.oversize.handling.mode": mode,
                **props,
            },
        )
        offsets = MemoryOffsetStore()
        run_engine(cfg, MemorySink(), offsets)
        fresh_db.a.update_one({"_id": "big"}, {"$set": {"n": 1}})
        fresh_db.a.insert_one({"_id": "small"})
        return cfg, offsets

    return prepare


def test_fail_mode_stops_with_advice(big_update: Any) -> None:
    cfg, offsets = big_update("fail")
    with pytest.raises(OversizeEventError, match="split"):
        run_engine(cfg, MemorySink(), offsets)


def test_skip_mode_drops_events_over_the_threshold(big_update: Any) -> None:
    cfg, offsets = big_update("skip", **{"cursor.oversize.skip.threshold": 1024 * 1024})
    sink = MemorySink()
    run_engine(cfg, sink, offsets)
    assert [(v["op"], orjson.loads(v["after"])["_id"]) for v in sink.values()] == [("c", "small")]


def test_split_mode_reassembles_fragments(big_update: Any) -> None:
    cfg, offsets = big_update("split")
    sink = MemorySink()
    run_engine(cfg, sink, offsets)  # an 18 MiB event takes a while to arrive
    update, insert = sink.values()
    assert update["op"] == "u" and insert["op"] == "c"
    assert orjson.loads(update["after"])["n"] == 1 and orjson.loads(update["before"])["n"] == 0
    assert len(orjson.loads(update["after"])["blob"]) == len(BIG)
    stored = offsets.load()
    assert stored is not None and stored.position is not None
