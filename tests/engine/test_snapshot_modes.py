"""snapshot.mode behaviour, markers, parallel copy, filter overrides, interrupted snapshots."""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any

import bson
import bson.errors
import orjson
import pytest
from bson.codec_options import CodecOptions

from mongocdc_core.api import current_cluster_time
from mongocdc_core.coordinator import Engine
from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.events.raw import RawDocuments
from mongocdc_core.offsets import MemoryOffsetStore, Offset
from mongocdc_core.source.snapshot import SnapshotChunk, SnapshotCopier
from tests.engine.engine_support import MemorySink, make_config, replay, run_engine, source_state


def _seed(db: Any, sizes: dict[str, int]) -> None:
    for name, n in sizes.items():
        if n:
            db[name].insert_many([{"_id": i, "n": i, "coll": name} for i in range(n)])
        else:
            db.create_collection(name)


def _markers(sink: MemorySink) -> list[tuple[str, str]]:
    return [(v["source"]["collection"], v["source"]["snapshot"]) for v in sink.values() if v["op"] == "r"]


def test_initial_snapshot_then_stream_then_no_second_snapshot(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 3, "b": 2})
    cfg = make_config(mongo_uri, fresh_db.name)
    offsets = MemoryOffsetStore()
    sink = MemorySink()
    summary = run_engine(cfg, sink, offsets)
    assert summary.snapshot_performed and summary.snapshot_completed
    assert summary.snapshot_documents == 5
    assert _markers(sink) == [
        ("a", "first"),
        ("a", "true"),
        ("a", "last_in_data_collection"),
        ("b", "first_in_data_collection"),
        ("b", "last"),
    ]
    # every read carries the snapshot's start position, recorded before the copy
    positions = {r.position for r in sink.data()}
    assert len(positions) == 1
    stored = offsets.load()
    assert stored is not None and stored.snapshot is None and stored.resume_token is not None

    fresh_db.a.insert_one({"_id": 10})
    fresh_db.b.delete_one({"_id": 0})
    second = MemorySink()
    summary = run_engine(cfg, second, offsets)
    assert not summary.snapshot_performed
    assert [v["op"] for v in second.values()] == ["c", "d"]
    assert all(r.position > next(iter(positions)) for r in second.data())
    for name in ("a", "b"):
        ns = f"{fresh_db.name}.{name}"
        assert replay(sink.records + second.records, ns) == source_state(fresh_db[name])


def test_changes_during_the_snapshot_are_streamed_afterwards(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 50})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.fetch.size": 5})
    sink = MemorySink()
    engine = Engine(cfg, sink, MemoryOffsetStore())
    original = sink.write
    changed: list[int] = []

    def write_and_change(records: Any) -> None:
        original(records)
        if not changed:  # first chunk delivered: change documents the copy may or may not have seen
            changed.append(1)
            fresh_db.a.update_one({"_id": 49}, {"$set": {"n": -1}})
            fresh_db.a.insert_one({"_id": 100})

    sink.write = write_and_change  # type: ignore[method-assign]
    engine.run(max_events=2)  # the update and the insert, streamed after the snapshot
    ns = f"{fresh_db.name}.a"
    assert replay(sink.records, ns) == source_state(fresh_db.a)
    assert {v["op"] for v in sink.values()} >= {"r", "u", "c"}


def test_always_snapshots_on_every_start(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 2})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "always"})
    offsets = MemoryOffsetStore()
    for _ in range(2):
        sink = MemorySink()
        summary = run_engine(cfg, sink, offsets)
        assert summary.snapshot_performed and summary.snapshot_documents == 2


def test_initial_only_stops_after_the_snapshot(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 2})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "initial_only"})
    offsets = MemoryOffsetStore()
    summary = run_engine(cfg, MemorySink(), offsets)
    assert summary.stopped_because == "snapshot_only" and summary.snapshot_documents == 2
    again = run_engine(cfg, MemorySink(), offsets)
    assert not again.snapshot_performed and again.stopped_because == "snapshot_only"


@pytest.mark.parametrize("mode", ["no_data", "never"])
def test_no_data_streams_from_now_without_reads(fresh_db: Any, mongo_uri: str, mode: str) -> None:
    _seed(fresh_db, {"a": 3})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": mode})
    offsets = MemoryOffsetStore()
    first = MemorySink()
    summary = run_engine(cfg, first, offsets)
    assert not summary.snapshot_performed and first.data() == []
    assert offsets.load() is not None  # "now" was pinned, so the next start misses nothing
    fresh_db.a.insert_one({"_id": 7})
    second = MemorySink()
    run_engine(cfg, second, offsets)
    assert [(v["op"], v["after"]) for v in second.values()] == [("c", '{"_id": 7}')]


def test_when_needed_snapshots_without_offset_only(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 2})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "when_needed"})
    offsets = MemoryOffsetStore()
    assert run_engine(cfg, MemorySink(), offsets).snapshot_performed
    assert not run_engine(cfg, MemorySink(), offsets).snapshot_performed


def test_configuration_based(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 2})
    cfg = make_config(
        mongo_uri,
        fresh_db.name,
        **{
            "snapshot.mode": "configuration_based",
            "snapshot.mode.configuration.based.snapshot.data": "true",
            "snapshot.mode.configuration.based.start.stream": "false",
        },
    )
    summary = run_engine(cfg, MemorySink(), MemoryOffsetStore())
    assert summary.snapshot_documents == 2 and summary.stopped_because == "snapshot_only"


def test_parallel_copy_markers_and_completeness(fresh_db: Any, mongo_uri: str) -> None:
    sizes = {"a": 40, "b": 1, "c": 0, "d": 25, "e": 7}
    _seed(fresh_db, sizes)
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.max.threads": 3, "snapshot.fetch.size": 4})
    sink = MemorySink()
    run_engine(cfg, sink, MemoryOffsetStore())
    markers = _markers(sink)
    assert len(markers) == sum(sizes.values())
    assert markers[0][1] == "first" and markers[-1][1] == "last"
    assert [m for _, m in markers].count("first") == 1 and [m for _, m in markers].count("last") == 1
    for name, n in sizes.items():
        mine = [m for c, m in markers if c == name]
        assert len(mine) == n
        if n > 1:
            assert mine[0] in ("first", "first_in_data_collection")
            assert mine[-1] in ("last", "last_in_data_collection")
        for name2 in sizes:
            assert replay(sink.records, f"{fresh_db.name}.{name2}") == source_state(fresh_db[name2])


def test_snapshot_filters_and_include_list(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 10, "b": 3, "c": 3})
    db = fresh_db.name
    cfg = make_config(
        mongo_uri,
        db,
        **{
            "snapshot.include.collection.list": f"{db}\\.(a|b)",
            "snapshot.collection.filter.overrides": f"{db}.a",
            f"snapshot.collection.filter.overrides.{db}.a": '{"n": {"$gte": 7}}',
        },
    )
    sink = MemorySink()
    run_engine(cfg, sink, MemoryOffsetStore())
    reads = [(v["source"]["collection"], orjson.loads(v["after"])["_id"]) for v in sink.values()]
    assert reads == [("a", 7), ("a", 8), ("a", 9), ("b", 0), ("b", 1), ("b", 2)]


def test_snapshot_delay_and_stop_during_delay(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 1})
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.delay.ms": 60000})
    offsets = MemoryOffsetStore()
    engine = Engine(cfg, MemorySink(), offsets)
    import threading

    stop_at = current_cluster_time(cfg)
    threading.Timer(0.3, engine.stop).start()
    summary = engine.run(stop_at=stop_at)
    assert summary.snapshot_performed and not summary.snapshot_completed


def test_interrupted_snapshot_skips_completed_collections(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 5, "b": 4})  # biggest first: a, then b
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.fetch.size": 2})
    offsets = MemoryOffsetStore()

    class StopInB(ProgressListener):
        def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
            if namespace.endswith(".b"):
                engine.stop()  # stop while b is being copied: a is complete

    first = MemorySink()
    engine = Engine(cfg, first, offsets, progress=StopInB())
    summary = engine.run(stop_at=current_cluster_time(cfg))
    assert not summary.snapshot_completed
    stored = offsets.load()
    assert isinstance(stored, Offset) and stored.snapshot is not None and stored.snapshot.running
    assert stored.snapshot.completed == [f"{fresh_db.name}.a"]

    resumed = MemorySink()
    summary = run_engine(cfg, resumed, offsets)
    assert summary.snapshot_completed
    assert {v["source"]["collection"] for v in resumed.values()} == {"b"}
    # A graceful stop resumes b after its last flushed key: every document of b exactly once overall.
    b_reads = [orjson.loads(v["after"])["_id"] for v in [*first.values(), *resumed.values()]
               if v["source"]["collection"] == "b"]
    assert sorted(b_reads) == [0, 1, 2, 3]


def _copy_all(client: Any, cfg: Any, namespaces: list[str], threads: int) -> tuple[list[Any], SnapshotCopier]:
    chunks: list[SnapshotChunk] = []

    def emit(chunk: SnapshotChunk) -> bool:
        chunks.append(chunk)
        return True

    copier = SnapshotCopier(client, cfg, namespaces, emit, threads=threads, chunk_size=7)
    assert copier.run()
    return chunks, copier


def test_large_collection_is_split_into_id_ranges(fresh_db: Any, mongo_uri: str) -> None:
    fresh_db.a.insert_many([{"_id": i} for i in range(100)])
    cfg = make_config(mongo_uri, fresh_db.name, **{"mongocdc.snapshot.split.size": 25})
    ns = f"{fresh_db.name}.a"
    assert len(SnapshotCopier(fresh_db.client, cfg, [ns], lambda c: True).plan(ns)) == 4
    chunks, _ = _copy_all(fresh_db.client, cfg, [ns], threads=4)
    ids = [d["_id"] for c in chunks for d in c.documents]
    assert sorted(ids) == list(range(100)) and len(ids) == 100
    markers = [m for c in chunks for m in c.markers]
    assert markers[0] == "first" and markers[-1] == "last" and set(markers[1:-1]) == {"true"}
    assert [c.final for c in chunks].count(True) == 1 and chunks[-1].final
    assert {c.part for c in chunks} == {0, 1, 2, 3}


def test_mixed_id_types_are_split_in_the_servers_order(fresh_db: Any, mongo_uri: str) -> None:
    fresh_db.a.insert_many([{"_id": i} for i in range(30)] + [{"_id": f"s{i}"} for i in range(30)])
    cfg = make_config(mongo_uri, fresh_db.name, **{"mongocdc.snapshot.split.size": 10})
    ns = f"{fresh_db.name}.a"
    assert len(SnapshotCopier(fresh_db.client, cfg, [ns], lambda c: True).plan(ns)) == 6
    chunks, _ = _copy_all(fresh_db.client, cfg, [ns], threads=4)
    ids = [d["_id"] for c in chunks for d in c.documents]
    assert len(ids) == 60 and {str(i) for i in ids} == {str(i) for i in range(30)} | {f"s{i}" for i in range(30)}


def _offsets_of_another_replica_set(cfg: Any) -> MemoryOffsetStore:
    """Offsets a connector recorded against another deployment (same name, new connection string)."""
    offsets = MemoryOffsetStore()
    run_engine(cfg, MemorySink(), offsets)
    stored = offsets.load()
    assert stored is not None and stored.replica_set  # offsets name the replica set they belong to
    stored.replica_set = f"{stored.replica_set}-before-migration"
    offsets.save(stored)
    return offsets


def test_offsets_of_another_replica_set_are_refused_by_default(fresh_db: Any, mongo_uri: str) -> None:
    from mongocdc_core.source.errors import OffsetInvalidError

    _seed(fresh_db, {"a": 2})
    cfg = make_config(mongo_uri, fresh_db.name)
    offsets = _offsets_of_another_replica_set(cfg)
    with pytest.raises(OffsetInvalidError, match="mongodb.allow.offset.invalidation=true"):
        run_engine(cfg, MemorySink(), offsets)


def test_allowed_offset_invalidation_takes_a_new_snapshot(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 2})
    cfg = make_config(mongo_uri, fresh_db.name)
    offsets = _offsets_of_another_replica_set(cfg)
    sink = MemorySink()
    summary = run_engine(cfg.with_properties({"mongodb.allow.offset.invalidation": "true"}), sink, offsets)
    assert summary.snapshot_performed and summary.snapshot_documents == 2
    stored = offsets.load()
    assert stored is not None and stored.replica_set is not None and not stored.replica_set.endswith("migration")


def test_workers_prepare_chunks_at_the_same_time_and_emit_them_in_order(fresh_db: Any, mongo_uri: str) -> None:
    """The conversion (``prepare``) of two ranges' chunks runs at once, outside the copier's lock; the
    chunks still reach ``emit`` one at a time, in the order their markers describe."""
    _seed(fresh_db, {"a": 60, "b": 45})
    cfg = make_config(mongo_uri, fresh_db.name, **{"mongocdc.snapshot.split.size": 15})
    both_preparing = threading.Barrier(2, timeout=60)  # broken (an error) if prepares cannot overlap
    prepared: list[str] = []
    emitted: list[SnapshotChunk] = []
    in_emit = threading.Lock()

    def prepare(chunk: SnapshotChunk) -> SnapshotChunk:
        if len(prepared) < 2 and threading.current_thread().name not in prepared:
            prepared.append(threading.current_thread().name)
            both_preparing.wait()
        return dataclasses.replace(chunk, records=[])

    def emit(chunk: SnapshotChunk) -> bool:
        assert in_emit.acquire(blocking=False), "two chunks emitted at once"
        try:
            assert chunk.records == []  # what prepare made of it
            emitted.append(chunk)
        finally:
            in_emit.release()
        return True

    namespaces = [f"{fresh_db.name}.a", f"{fresh_db.name}.b"]
    copier = SnapshotCopier(fresh_db.client, cfg, namespaces, emit, threads=4, chunk_size=4, prepare=prepare)
    assert copier.run()
    assert len(set(prepared)) == 2
    ids = sorted((c.namespace, d["_id"]) for c in emitted for d in c.documents)
    assert ids == sorted([(namespaces[0], i) for i in range(60)] + [(namespaces[1], i) for i in range(45)])
    markers = [m for c in emitted for m in c.markers]
    assert markers[0] == "first" and markers[-1] == "last"
    assert markers.count("first") == 1 and markers.count("last") == 1
    assert markers.count("first_in_data_collection") == 1 and markers.count("last_in_data_collection") == 1
    assert [c.final for c in emitted].count(True) == 2 and emitted[-1].final


def test_a_failing_prepare_stops_every_worker_and_is_raised(fresh_db: Any, mongo_uri: str) -> None:
    _seed(fresh_db, {"a": 200})
    cfg = make_config(mongo_uri, fresh_db.name, **{"mongocdc.snapshot.split.size": 20})
    calls = itertools.count()
    failed: list[SnapshotChunk] = []
    emitted: list[SnapshotChunk] = []

    def prepare(chunk: SnapshotChunk) -> SnapshotChunk:
        if next(calls) == 5:
            failed.append(chunk)
            raise RuntimeError("conversion broke")
        return dataclasses.replace(chunk, records=[])

    def emit(chunk: SnapshotChunk) -> bool:
        emitted.append(chunk)
        return True

    copier = SnapshotCopier(fresh_db.client, cfg, [f"{fresh_db.name}.a"], emit, threads=4, chunk_size=4,
                            prepare=prepare)
    with pytest.raises(RuntimeError, match="conversion broke"):
        copier.run()  # returns: no worker waits for the turn of the chunk that failed
    # Only prepared chunks were emitted, and never the one that failed.
    assert failed and all(chunk.records == [] for chunk in emitted)
    assert not any(chunk.documents is failed[0].documents for chunk in emitted)
    assert not emitted or emitted[0].markers[0] == "first"  # what was emitted is the start of the order


def _raw(*docs: dict[str, Any]) -> RawDocuments:
    """A raw batch, as the copier's cursors read them."""
    return RawDocuments(b"".join(bson.encode(doc) for doc in docs), CodecOptions())


def test_a_failure_while_ordering_chunks_leaves_no_turn_unpassed(fresh_db: Any, mongo_uri: str) -> None:
    """White-box: a worker that takes a ticket and then fails in the same locked section (here the
    held final record of collection x gets its ticket, then the chunk of y cannot be decoded) still
    passes that ticket's turn, so the next worker is not left waiting for it forever."""
    cfg = make_config(mongo_uri, fresh_db.name)
    emitted: list[SnapshotChunk] = []

    def emit(chunk: SnapshotChunk) -> bool:
        emitted.append(chunk)
        return True

    x, y = f"{fresh_db.name}.x", f"{fresh_db.name}.y"
    copier = SnapshotCopier(fresh_db.client, cfg, [x, y], emit, threads=2, filters={})
    copier._parts_left = {x: 1, y: 2}  # what run() plans: x in one range, y in two
    assert copier._deliver(x, 0, _raw({"_id": 1}, {"_id": 2}), part_done=True)  # x's final record is now held
    damaged = bytearray(bson.encode({"_id": 7, "s": "a"}))
    damaged[damaged.index(b"a\x00")] = 0xFF  # invalid UTF-8: decoding the chunk's last key fails
    with pytest.raises(bson.errors.InvalidBSON):
        copier._deliver(y, 0, RawDocuments(bytes(damaged), CodecOptions()), part_done=False)
    assert copier.stop.is_set()
    other_worker = threading.Thread(target=copier._deliver, args=(y, 1, _raw({"_id": 9})), kwargs={"part_done": False},
                                    daemon=True)
    other_worker.start()
    other_worker.join(60)
    assert not other_worker.is_alive(), "a worker waits for the turn of a ticket that was lost"
    assert [d["_id"] for chunk in emitted for d in chunk.documents] == [1]  # nothing after the failure
