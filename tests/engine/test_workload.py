"""Random workloads with transactions: replaying the captured records rebuilds the collection."""

from __future__ import annotations

import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mongocdc_core.offsets import MemoryOffsetStore
from tests.engine.engine_support import MemorySink, make_config, replay, run_engine, source_state

KEYS = st.integers(min_value=0, max_value=12)
VALUES = st.one_of(st.integers(-5, 5), st.text(max_size=4), st.lists(st.integers(0, 3), max_size=3))
FIELDS = st.sampled_from(["a", "b", "c"])

SINGLE = st.one_of(
    st.tuples(st.just("insert"), KEYS, VALUES),
    st.tuples(st.just("set"), KEYS, FIELDS, VALUES),
    st.tuples(st.just("unset"), KEYS, FIELDS),
    st.tuples(st.just("replace"), KEYS, VALUES),
    st.tuples(st.just("delete"), KEYS),
)
OPERATION = st.one_of(SINGLE, st.tuples(st.just("txn"), st.lists(SINGLE, min_size=1, max_size=4)))


def _apply(coll: Any, op: tuple[Any, ...], session: Any = None) -> None:
    kind = op[0]
    if kind == "insert":
        coll.update_one({"_id": op[1]}, {"$setOnInsert": {"v": op[2]}}, upsert=True, session=session)
    elif kind == "set":
        coll.update_one({"_id": op[1]}, {"$set": {op[2]: op[3]}}, session=session)
    elif kind == "unset":
        coll.update_one({"_id": op[1]}, {"$unset": {op[2]: ""}}, session=session)
    elif kind == "replace":
        coll.replace_one({"_id": op[1]}, {"r": op[2]}, session=session)
    elif kind == "delete":
        coll.delete_one({"_id": op[1]}, session=session)


def _run(coll: Any, ops: list[tuple[Any, ...]]) -> None:
    client = coll.database.client
    for op in ops:
        if op[0] == "txn":
            with client.start_session() as session, session.start_transaction():
                for inner in op[1]:
                    _apply(coll, inner, session)
        else:
            _apply(coll, op)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    before=st.lists(OPERATION, max_size=8),
    during=st.lists(OPERATION, min_size=1, max_size=15),
    capture_mode=st.sampled_from(["change_streams", "change_streams_update_full"]),
)
def test_replay_of_snapshot_and_stream_equals_source(
    mongo_client: Any, mongo_uri: str, before: list[Any], during: list[Any], capture_mode: str
) -> None:
    db = mongo_client[f"w_{uuid.uuid4().hex[:10]}"]
    try:
        coll = db.c
        coll.insert_one({"_id": "anchor"})
        _run(coll, before)
        cfg = make_config(
            mongo_uri, db.name, **{"capture.mode": capture_mode, "provide.transaction.metadata": "true"}
        )
        offsets = MemoryOffsetStore()
        sink = MemorySink()
        run_engine(cfg, sink, offsets)
        _run(coll, during)
        run_engine(cfg, sink, offsets)
        assert replay(sink.records, f"{db.name}.c") == source_state(coll)
        positions = [r.position for r in sink.data() if r.op != "r"]
        assert positions == sorted(positions)
    finally:
        mongo_client.drop_database(db.name)
