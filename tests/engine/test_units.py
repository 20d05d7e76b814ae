"""Engine parts that need no server: offsets, backoff, markers, snapshot modes, pipelines, queue."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from bson import Timestamp

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets import FileOffsetStore, Offset, OffsetError, SnapshotState
from mongocdc_core.positions import Position
from mongocdc_core.source.connection import Backoff, check_topology
from mongocdc_core.source.errors import CdcError, HistoryLostError, TopologyError
from mongocdc_core.source.oplog import OplogWindow
from mongocdc_core.source.snapshot import (
    MARK_FIRST,
    MARK_FIRST_IN_COLLECTION,
    MARK_LAST,
    MARK_LAST_IN_COLLECTION,
    MARK_TRUE,
    load_snapshotter,
    snapshot_marker,
)
from mongocdc_core.source.stream import (
    EventQueue,
    StreamItem,
    _reassemble,
    build_pipeline,
    watch_options,
)

URI = "mongodb://127.0.0.1:1/?replicaSet=rs0"


def config(**props: Any) -> ConnectorConfig:
    base: dict[str, Any] = {"mongodb.connection.string": URI, "topic.prefix": "srv"}
    base.update({k.replace("_", "."): v for k, v in props.items()})
    return ConnectorConfig.from_dict(base)


def test_offset_roundtrip_is_lossless(tmp_path: Any) -> None:
    store = FileOffsetStore(tmp_path / "o" / "offsets.json")
    assert store.load() is None
    offset = Offset(
        resume_token={"_data": "8263F0A1B2000000012B0429296E1404"},
        position=Position(1700000000, 7, 3),
        snapshot=SnapshotState(
            collections=["a.x", "a.y"],
            completed=["a.x"],
            start_position=Position(1700000000, 1),
            start_token={"_data": "82AA"},
        ),
        incremental={"chunk": 3},
    )
    store.save(offset)
    loaded = store.load()
    assert loaded == offset
    assert loaded is not None and loaded.snapshot is not None
    assert loaded.snapshot.remaining == ["a.y"]
    assert loaded.snapshot_in_progress
    # no temp files left behind by the atomic replace
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["offsets.json"]


def test_corrupt_offset_file_is_a_clear_error(tmp_path: Any) -> None:
    path = tmp_path / "offsets.json"
    path.write_text("{not json")
    with pytest.raises(OffsetError, match="offsets.json"):
        FileOffsetStore(path).load()


def test_backoff_follows_the_seed_table() -> None:
    backoff = Backoff(1000, 120000, 16)
    delays = [backoff.delay_ms(n) // 1000 for n in range(1, 17)]
    assert delays == [1, 2, 4, 8, 16, 32, 64, 120, 120, 120, 120, 120, 120, 120, 120, 120]
    totals = [sum(delays[:n]) for n in range(1, 17)]
    assert totals[6] == 127 and totals[-1] == 20 * 60 + 7  # 02:07 and 20:07


def test_backoff_gives_up_after_max_attempts() -> None:
    from pymongo.errors import AutoReconnect

    calls = []

    def failing() -> None:
        calls.append(1)
        raise AutoReconnect("down")

    with pytest.raises(CdcError, match="3 reconnection attempts"):
        Backoff(1, 2, 3).run(failing, what="test")
    assert len(calls) == 4  # the first try plus three reconnection attempts


class _FakeAdmin:
    def __init__(self, hello: dict[str, Any]) -> None:
        self.hello = hello

    def command(self, name: str) -> dict[str, Any]:
        assert name == "hello"
        return self.hello


class _FakeShards:
    def find(self, *args: Any) -> list[dict[str, Any]]:
        return [{"_id": "shard0", "host": "shard0/h:2"}, {"_id": "shard1", "host": "shard1/h:3"}]


class _FakeConfig:
    shards = _FakeShards()


class _FakeClient:
    def __init__(self, hello: dict[str, Any]) -> None:
        self.admin = _FakeAdmin(hello)
        self.config = _FakeConfig()
        self.address = ("127.0.0.1", 27017)


def test_topology_accepts_replica_sets_and_mongos_and_refuses_standalone() -> None:
    rs = check_topology(_FakeClient({"setName": "rs0", "hosts": ["h:1"]}))  # type: ignore[arg-type]
    assert rs.kind == "replica_set" and rs.set_name == "rs0"
    sharded = check_topology(_FakeClient({"msg": "isdbgrid"}))  # type: ignore[arg-type]
    assert sharded.kind == "sharded" and sharded.shards == ("shard0", "shard1") and sharded.source_name == "cluster"
    assert rs.source_name == "rs0"
    with pytest.raises(TopologyError, match="standalone.*no oplog"):
        check_topology(_FakeClient({"isWritablePrimary": True}))  # type: ignore[arg-type]


def test_snapshot_markers_follow_debezium_precedence() -> None:
    assert snapshot_marker(True, False, True, False) == MARK_FIRST
    assert snapshot_marker(True, False, True, True) == MARK_FIRST  # one-document first collection
    assert snapshot_marker(False, False, True, False) == MARK_FIRST_IN_COLLECTION
    assert snapshot_marker(False, False, False, True) == MARK_LAST_IN_COLLECTION
    assert snapshot_marker(False, True, False, True) == MARK_LAST
    assert snapshot_marker(True, True, True, True) == MARK_LAST  # a single document snapshot
    assert snapshot_marker(False, False, False, False) == MARK_TRUE


@pytest.mark.parametrize(
    ("mode", "fresh", "restarted", "in_progress", "stream", "on_error"),
    [
        ("always", True, True, True, True, False),
        ("initial", True, False, True, True, False),
        ("initial_only", True, False, True, False, False),
        ("no_data", False, False, False, True, False),
        ("never", False, False, False, True, False),
        ("when_needed", True, False, True, True, True),
    ],
)
def test_builtin_snapshot_modes(
    mode: str, fresh: bool, restarted: bool, in_progress: bool, stream: bool, on_error: bool
) -> None:
    s = load_snapshotter(config(snapshot_mode=mode))
    assert s.should_snapshot_data(False, False) is fresh
    assert s.should_snapshot_data(True, False) is restarted
    assert s.should_snapshot_data(True, True) is in_progress
    assert s.should_stream() is stream
    assert s.should_snapshot_on_data_error() is on_error


def test_configuration_based_mode_reads_its_properties() -> None:
    cfg = ConnectorConfig.from_dict(
        {
            "mongodb.connection.string": URI,
            "topic.prefix": "srv",
            "snapshot.mode": "configuration_based",
            "snapshot.mode.configuration.based.snapshot.data": "true",
            "snapshot.mode.configuration.based.start.stream": "false",
            "snapshot.mode.configuration.based.snapshot.on.data.error": "true",
        }
    )
    s = load_snapshotter(cfg)
    assert s.should_snapshot_data(True, False) and not s.should_stream() and s.should_snapshot_on_data_error()


def test_custom_mode_without_registration_names_the_entry_point_group() -> None:
    cfg = ConnectorConfig.from_dict(
        {
            "mongodb.connection.string": URI,
            "topic.prefix": "srv",
            "snapshot.mode": "custom",
            "snapshot.mode.custom.name": "nope",
        }
    )
    with pytest.raises(CdcError, match="mongocdc.snapshot_modes"):
        load_snapshotter(cfg)


def test_custom_mode_loads_a_registered_class(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata as md

    import mongocdc_core.source.snapshot as snap

    class Only:
        configured: Any = None

        def name(self) -> str:
            return "only"

        def configure(self, cfg: Any) -> None:
            self.configured = cfg

        def should_snapshot_data(self, offset_exists: bool, snapshot_in_progress: bool) -> bool:
            return not offset_exists

        def should_stream(self) -> bool:
            return False

        def should_snapshot_on_data_error(self) -> bool:
            return False

        def should_stream_events_starting_from_snapshot(self) -> bool:
            return True

        def snapshot_completed(self) -> None:
            pass

        def snapshot_aborted(self) -> None:
            pass

    ep = md.EntryPoint("only", f"{__name__}:Only", snap.ENTRY_POINT_GROUP)
    monkeypatch.setattr(ep.__class__, "load", lambda self: Only)
    monkeypatch.setattr(snap, "entry_points", lambda group: [ep] if group == snap.ENTRY_POINT_GROUP else [])
    cfg = ConnectorConfig.from_dict(
        {
            "mongodb.connection.string": URI,
            "topic.prefix": "srv",
            "snapshot.mode": "custom",
            "snapshot.mode.custom.name": "only",
        }
    )
    s = load_snapshotter(cfg)
    assert isinstance(s, Only) and s.configured is cfg and not s.should_stream()


@pytest.mark.parametrize(
    ("mode", "full_type", "expected"),
    [
        ("change_streams", "lookup", {}),
        ("change_streams_update_full", "lookup", {"full_document": "updateLookup"}),
        ("change_streams_update_full", "post_image", {"full_document": "required"}),
        ("change_streams_with_pre_image", "lookup", {"full_document_before_change": "whenAvailable"}),
        (
            "change_streams_update_full_with_pre_image",
            "lookup",
            {"full_document": "updateLookup", "full_document_before_change": "whenAvailable"},
        ),
    ],
)
def test_capture_mode_watch_options(mode: str, full_type: str, expected: dict[str, str]) -> None:
    cfg = config(capture_mode=mode, capture_mode_full_update_type=full_type)
    assert watch_options(cfg) == expected


def test_pipeline_orders() -> None:
    user = '[{"$match": {"operationType": "insert"}}]'
    internal_first = build_pipeline(config(cursor_pipeline=user))
    assert internal_first[-1] == {"$match": {"operationType": "insert"}}
    assert "$addFields" in internal_first[0]
    user_first = build_pipeline(config(cursor_pipeline=user, cursor_pipeline_order="user_first"))
    assert user_first[0] == {"$match": {"operationType": "insert"}}
    user_only = build_pipeline(config(cursor_pipeline=user, cursor_pipeline_order="user_only"))
    assert user_only == [{"$match": {"operationType": "insert"}}]


def test_oversize_modes_add_their_stages() -> None:
    split = build_pipeline(config(cursor_oversize_handling_mode="split"))
    assert split[-1] == {"$changeStreamSplitLargeEvent": {}}
    skip = build_pipeline(config(cursor_oversize_handling_mode="skip", cursor_oversize_skip_threshold="100"))
    assert "$bsonSize" in str(skip[0]) and "100" in str(skip[0])


def test_skipped_operations_leave_the_server_side_filter() -> None:
    stages = build_pipeline(config(skipped_operations="c,d"))
    assert "'$in': ['update', 'replace']" in str(stages[1])


def test_split_fragments_are_reassembled() -> None:
    fragments = [
        {"_id": {"_data": "1"}, "splitEvent": {"fragment": 1, "of": 2}, "operationType": "update", "ns": {}},
        {"_id": {"_data": "2"}, "splitEvent": {"fragment": 2, "of": 2}, "fullDocument": {"_id": 1}},
    ]
    merged = _reassemble(fragments)
    assert merged == {"_id": {"_data": "2"}, "operationType": "update", "ns": {}, "fullDocument": {"_id": 1}}


def _changes(*ids: int) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [({"_id": {"_data": str(i)}}, {"_data": str(i)}) for i in ids]


def test_queue_is_bounded_by_count_and_bytes() -> None:
    metrics = ConnectorMetrics("srv")
    queue = EventQueue(2, 100, metrics.streaming)
    stop = threading.Event()
    assert queue.put(StreamItem("changes", changes=_changes(1), size=60), stop)
    assert metrics.streaming.QueueRemainingCapacity == 1
    blocked = threading.Thread(target=queue.put, args=(StreamItem("changes", changes=_changes(2), size=60), stop))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # 120 bytes would exceed max.queue.size.in.bytes
    assert len(queue.get_batch(10, 0)) == 1
    blocked.join()
    assert [i.size for i in queue.get_batch(10, 0)] == [60]
    assert metrics.streaming.CurrentQueueSizeInBytes == 0


def test_queue_counts_the_events_of_an_item() -> None:
    """An item of several changes takes one place per event in ``max.queue.size``."""
    metrics = ConnectorMetrics("srv")
    queue = EventQueue(4, 0, metrics.streaming)
    stop = threading.Event()
    assert queue.put(StreamItem("changes", changes=_changes(1, 2, 3)), stop)
    assert metrics.streaming.QueueRemainingCapacity == 1 and queue.pending() == 3
    blocked = threading.Thread(target=queue.put, args=(StreamItem("changes", changes=_changes(4, 5)), stop))
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # 5 events would exceed max.queue.size
    assert [i.count for i in queue.get_batch(2, 0)] == [3]  # an item is never split
    blocked.join()
    assert queue.pending() == 2
    assert [tok for item in queue.get_batch(10, 0) for _, tok in item.changes or []] == [{"_data": "4"}, {"_data": "5"}]
    assert metrics.streaming.QueueRemainingCapacity == 4


def test_history_lost_messages_explain_recovery() -> None:
    err = HistoryLostError.for_offset(Timestamp(10, 1), Timestamp(20, 1), "initial", "offset file /x")
    text = str(err)
    assert "Timestamp(10, 1)" in text and "Timestamp(20, 1)" in text and "/x" in text and "when_needed" in text
    window = HistoryLostError.for_window(Timestamp(10, 1), Timestamp(11, 0), Timestamp(20, 1))
    assert "history lost" in str(window)
    assert OplogWindow(Timestamp(20, 1), Timestamp(30, 1), 0, None, 0.0).contains(Timestamp(20, 1))
    assert not OplogWindow(Timestamp(20, 1), Timestamp(30, 1), 0, None, 0.0).contains(Timestamp(20, 0))


def test_metrics_file_and_summary(tmp_path: Any) -> None:
    import orjson

    metrics = ConnectorMetrics("srv")
    metrics.snapshot.start(["a.x"])
    metrics.snapshot.rows("a.x", 5, "p")
    metrics.snapshot.finish(aborted=False)
    metrics.streaming.seen({"c": 1}, "p1", None, "tok")
    path = tmp_path / "metrics.json"
    metrics.write_file(path)
    data = orjson.loads(path.read_bytes())
    snap = data["debezium.mongodb:type=connector-metrics,context=snapshot,server=srv,task=0"]
    assert snap["RowsScanned"] == {"a.x": 5} and snap["SnapshotCompleted"] is True
    stream = data["debezium.mongodb:type=connector-metrics,context=streaming,server=srv,task=0"]
    assert stream["TotalNumberOfCreateEventsSeen"] == 1
    assert "1 events" in metrics.summary()


def test_unreachable_server_fails_after_the_configured_attempts() -> None:
    from mongocdc_core.source.connection import connect
    from mongocdc_core.source.errors import ConnectError
    from mongocdc_devstack.fixture import free_port

    cfg = ConnectorConfig.from_dict(
        {
            "mongodb.connection.string": f"mongodb://127.0.0.1:{free_port()}/?replicaSet=rs0",
            "topic.prefix": "srv",
            "mongodb.server.selection.timeout.ms": 100,
            "connect.backoff.initial.delay.ms": 10,
            "connect.backoff.max.delay.ms": 20,
            "connect.max.attempts": 2,
        }
    )
    metrics = ConnectorMetrics("srv")
    with pytest.raises(ConnectError, match="2 reconnection attempts"):
        connect(cfg, metrics)
    assert metrics.streaming.Connected is False


def test_refused_credentials_are_one_clear_error_not_a_retry() -> None:
    from pymongo.errors import OperationFailure

    from mongocdc_core.source.errors import AuthenticationError

    calls = []

    def refused() -> None:
        calls.append(1)
        raise OperationFailure("Authentication failed.", code=18, details={"codeName": "AuthenticationFailed"})

    with pytest.raises(AuthenticationError, match="refused the credentials") as info:
        Backoff(1, 2, 3).run(refused, what="connecting")
    assert len(calls) == 1 and "\n" not in str(info.value)


def test_connection_state_is_one_line_naming_host_attempt_delay_and_error() -> None:
    from pymongo.errors import ServerSelectionTimeoutError

    from mongocdc_core.receiver import ConnectionState

    states: list[ConnectionState] = []

    def down() -> None:
        raise ServerSelectionTimeoutError(
            "db1:27017: [Errno 111] Connection refused (configured timeouts: connectTimeoutMS: 20000.0ms), "
            "Timeout: 0.1s, Topology Description: <TopologyDescription id: 1, servers: [...]>"
        )

    with pytest.raises(CdcError):
        Backoff(100, 200, 2).run(down, what="connecting", on_retry=states.append, hosts="db1:27017")
    assert [s.line() for s in states] == [
        "connecting to db1:27017 failed (db1:27017: [Errno 111] Connection refused); reconnection attempt 1 of 2 in 0.1 s",
        "connecting to db1:27017 failed (db1:27017: [Errno 111] Connection refused); reconnection attempt 2 of 2 in 0.2 s",
    ]


def test_stop_while_a_server_selection_blocks_returns_at_once() -> None:
    from mongocdc_core.source.errors import Stopped

    stop = threading.Event()
    release = threading.Event()

    def blocked() -> None:
        release.wait(30)  # a server selection waiting for serverSelectionTimeoutMS

    threading.Timer(0.2, stop.set).start()
    try:
        with pytest.raises(Stopped):
            Backoff(100, 200, 2).run(blocked, what="connecting", stop=stop)
    finally:
        release.set()


def test_exit_codes_tell_failures_apart() -> None:
    from mongocdc_core.failures import EventProcessingError
    from mongocdc_core.run_command import exit_code
    from mongocdc_core.source.errors import (
        AuthenticationError,
        ChangeStreamFailedError,
        ConnectError,
        OffsetInvalidError,
    )

    codes = [
        exit_code(exc)
        for exc in (
            CdcError("x"), ConnectError("x"), AuthenticationError("x"), HistoryLostError("x"),
            ChangeStreamFailedError("x"), OffsetInvalidError("x"), EventProcessingError("x"),
        )
    ]
    assert codes == [1, 3, 4, 5, 6, 7, 8]
