"""The compatibility suite: the real Debezium MongoDB connector and mongocdc on the same writes.

Imported by one test module per Debezium version (``test_debezium_3_4.py``, ``test_debezium_3_6.py``,
so pytest-xdist runs the versions side by side); each provides the ``debezium_version`` fixture.

Every scenario runs both connectors twice against the same database, so that both read every
change after it happened (``updateLookup`` then returns the same documents to both):

1. phase A: Debezium starts (snapshot or not) and runs until it has streamed a probe written to a
   database mongocdc does not capture, then stops (its offsets file keeps the position); mongocdc
   runs its snapshot and streams up to the cluster time after that.
2. the workload (:mod:`tests.compat.workload`) runs with no connector attached, then a sentinel
   document is written to the probe database.
3. phase B: Debezium resumes from its offsets until the sentinel arrives; mongocdc resumes from
   its offsets up to the cluster time after the sentinel.

mongocdc runs once per event format. With ``mongocdc.event.format=debezium_3x`` every record must
equal Debezium's byte for byte, in the same global order, except for what never repeats between two
runs (normalized on both sides): the envelope's ``ts_ms`` (processing time), the snapshot reads'
``source.ts_*`` (read time) and ``source.version`` (the connector's own version); Debezium's bare
``NaN``/``Infinity`` inside ``before``/``after`` are spelled ``{"$numberDouble": …}`` by mongocdc,
so they are rewritten likewise before comparing. With the default format, the records must carry
the same data (:func:`meaning`) and differ only in the documented spelling.
"""

from __future__ import annotations

import json
import math
import os
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from bson import Decimal128, Int64, Timestamp, json_util
from bson.binary import Binary
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.coordinator import Engine
from mongocdc_core.events.records import Record
from mongocdc_core.offsets import FileOffsetStore
from tests.compat.debezium import DebeziumRecord, DebeziumRun, missing
from tests.compat.workload import create_collections, load_snapshot_data, stream_workload
from tests.engine.engine_support import MemorySink

pytestmark = pytest.mark.compat

PREFIX = "compat"
COLLECTIONS = ["docs", "keys", "ops", "other"]


@dataclass(frozen=True)
class Scenario:
    """One configuration both connectors run with."""

    name: str
    capture_mode: str
    schemas: bool
    transactions: bool
    snapshot: bool
    full_update_type: str = "lookup"
    extra: tuple[tuple[str, str], ...] = ()

    def common(self, uri: str, include: str) -> dict[str, str]:
        return {
            **dict(self.extra),
            "mongodb.connection.string": uri,
            "topic.prefix": PREFIX,
            "collection.include.list": include,
            "capture.mode": self.capture_mode,
            "capture.mode.full.update.type": self.full_update_type,
            "snapshot.mode": "initial" if self.snapshot else "no_data",
            "provide.transaction.metadata": str(self.transactions).lower(),
        }


SCENARIOS = [
    Scenario("update_full", "change_streams_update_full", schemas=True, transactions=True, snapshot=True),
    Scenario("plain", "change_streams", schemas=False, transactions=True, snapshot=False,
             extra=(("heartbeat.interval.ms", "50"),)),
    Scenario("pre_image", "change_streams_with_pre_image", schemas=True, transactions=False, snapshot=True,
             extra=(("tombstones.on.delete", "false"),)),
    Scenario("post_image", "change_streams_update_full_with_pre_image", schemas=False, transactions=True,
             snapshot=True, full_update_type="post_image",
             # Nested rules only where no parent field is removed later (docs/connector.md: Debezium drops a removed
             # parent of an excluded field from removedFields; mongocdc does not copy that).
             extra=(("field.exclude.list", "compat_post_image.docs.sub.empty,compat_post_image.*.marks"),
                    ("field.renames", "compat_post_image.ops.int:integer,compat_post_image.docs.sub.a:alpha"))),
]


# -- running both -----------------------------------------------------------------------------------------


def _cluster_time(client: MongoClient[Any]) -> Timestamp:
    ts = client.admin.command("hello")["$clusterTime"]["clusterTime"]
    assert isinstance(ts, Timestamp)
    return ts


class Mongocdc:
    """mongocdc in one event format, run in phases that resume from one offsets file."""

    def __init__(self, scenario: Scenario, uri: str, db: str, event_format: str, workdir: Path) -> None:
        props = {
            **scenario.common(uri, f"{db}\\..*"),
            "mongocdc.event.format": event_format,
            "mongocdc.schemas.enable": str(scenario.schemas).lower(),
            "poll.interval.ms": "50",
            "cursor.max.await.time.ms": "100",
        }
        self.cfg = ConnectorConfig.from_dict(props)
        self.offsets = FileOffsetStore(workdir / f"mongocdc-{event_format}.json")
        self.sink = MemorySink()

    def run_until(self, stop_at: Timestamp) -> None:
        Engine(self.cfg, self.sink, self.offsets).run(stop_at=stop_at)


HEARTBEAT_TOPIC = f"__debezium-heartbeat.{PREFIX}"


@dataclass
class Outputs:
    """Records in delivery order (heartbeats, which come when time passes, apart)."""

    debezium: list[DebeziumRecord]
    debezium_3x: list[Record]
    default: list[Record]
    heartbeats: dict[str, set[tuple[bytes | None, bytes | None]]]


def _has_last_read(records: list[DebeziumRecord]) -> bool:
    return any((r.payload() or {}).get("source", {}).get("snapshot") == "last" for r in records)


def run_both(
    version: str,
    scenario: Scenario,
    client: MongoClient[Any],
    uri: str,
    workdir: Path,
    snapshot_data: Callable[[Any], None],
    workload: Callable[[MongoClient[Any], Any], None],
) -> Outputs:
    """Phases A and B (module docstring) for Debezium and mongocdc in both formats."""
    db_name = f"compat_{scenario.name}"
    probe_db = f"{db_name}_probe"
    client.drop_database(db_name)
    client.drop_database(probe_db)
    db = client[db_name]
    create_collections(db, COLLECTIONS)
    if scenario.snapshot:
        snapshot_data(db)
    probes = client[probe_db].probe
    debezium_props = {
        **scenario.common(uri, f"{db_name}\\..*,{probe_db}\\..*"),
        "converter.schemas.enable": str(scenario.schemas).lower(),
        "cursor.max.await.time.ms": "100",
    }
    probe_topic = f"{PREFIX}.{probe_db}.probe"
    count = iter(range(1_000_000))

    def probe() -> None:
        probes.insert_one({"_id": next(count)})

    with DebeziumRun(version, workdir, debezium_props, name="a") as run:
        if scenario.snapshot:
            run.wait_for(_has_last_read, "snapshot read marked 'last'")
        run.wait_for(lambda records: any(r.topic == probe_topic for r in records), "probe event", tick=probe)
        phase_a = run.stop()
    mongocdc = {fmt: Mongocdc(scenario, uri, db_name, fmt, workdir) for fmt in ("debezium_3x", "change_streams")}
    after_probes = _cluster_time(client)
    for connector in mongocdc.values():
        connector.run_until(after_probes)

    workload(client, db)
    probes.insert_one({"_id": "sentinel"})
    after_sentinel = _cluster_time(client)

    with DebeziumRun(version, workdir, debezium_props, name="b") as run:
        sentinel_key = b'"\\"sentinel\\""'
        run.wait_for(lambda records: any(r.topic == probe_topic and sentinel_key in (r.key or b"") for r in records),
                     "sentinel event")
        phase_b = run.stop()
    for connector in mongocdc.values():
        connector.run_until(after_sentinel)
    debezium = without_repeated_ends([r for r in phase_a + phase_b if r.topic != probe_topic])
    ours = {fmt: connector.sink.records for fmt, connector in mongocdc.items()}
    heartbeats = {
        "debezium": {(r.key, _heartbeat(r.value)) for r in debezium if r.topic == HEARTBEAT_TOPIC},
        "debezium_3x": {(r.key, _heartbeat(r.value)) for r in ours["debezium_3x"] if r.topic == HEARTBEAT_TOPIC},
    }
    return Outputs(
        [r for r in debezium if r.topic != HEARTBEAT_TOPIC],
        [r for r in ours["debezium_3x"] if r.topic != HEARTBEAT_TOPIC],
        [r for r in ours["change_streams"] if r.topic != HEARTBEAT_TOPIC],
        heartbeats,
    )


def _heartbeat(value: bytes | None) -> bytes | None:
    """A heartbeat value with its time zeroed."""
    return None if value is None else re.sub(rb'"ts_ms":\d+', b'"ts_ms":0', value)


def without_repeated_ends(records: list[DebeziumRecord]) -> list[DebeziumRecord]:
    """Debezium 3.4 writes a transaction's END again at the next non-transactional event after the
    one that ended it; mongocdc writes each END once, so the repeats are left out before comparing."""
    ended: set[str] = set()
    kept = []
    for record in records:
        payload = record.payload() if record.topic == f"{PREFIX}.transaction" else None
        if payload is not None and payload["status"] == "END":
            if payload["id"] in ended:
                continue
            ended.add(payload["id"])
        kept.append(record)
    return kept


# -- comparing bytes --------------------------------------------------------------------------------------

# A JSON string token, or a bare non-finite number (outside strings) in Debezium's document text.
_NON_FINITE = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def _valid_json_doubles(text: str) -> str:
    return _NON_FINITE.sub(lambda m: '{"$numberDouble": "' + m.group(1) + '"}' if m.group(1) else m.group(0), text)


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def normalized(value: bytes | None, *, debezium: bool) -> bytes | None:
    """A record value with what differs between any two runs zeroed (module docstring).

    The value is parsed and re-serialized compactly, which reproduces JsonConverter's bytes exactly
    (checked here), so equal results mean equal bytes apart from the zeroed fields.
    """
    if value is None:
        return None
    parsed = json.loads(value)
    assert _dump(parsed) == value, f"not compact JSON as JsonConverter writes it: {value[:300]!r}"
    payload = parsed.get("payload", parsed) if "schema" in parsed else parsed
    if "source" in payload:
        payload["ts_ms"] = 0
        source = payload["source"]
        source["version"] = "?"
        if payload["op"] == "r":
            source["ts_ms"] = source["ts_us"] = source["ts_ns"] = 0
        if debezium:
            for name in ("before", "after"):
                if isinstance(payload[name], str):
                    payload[name] = _valid_json_doubles(payload[name])
    return _dump(parsed)


def _first_difference(a: bytes | None, b: bytes | None) -> str:
    if a is None or b is None:
        return f"Debezium: {a!r}\nmongocdc: {b!r}"
    at = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    start = max(0, at - 200)
    return f"at byte {at}:\nDebezium: ...{a[start:at + 200]!r}\nmongocdc: ...{b[start:at + 200]!r}"


def assert_same_bytes(debezium: list[DebeziumRecord], mongocdc: list[Record]) -> None:
    """Same records (topic, key bytes, normalized value bytes) in the same order."""
    left = [(r.topic, r.key, normalized(r.value, debezium=True)) for r in debezium]
    right = [(r.topic, r.key, normalized(r.value, debezium=False)) for r in mongocdc]
    for i, (a, b) in enumerate(zip(left, right, strict=False)):
        assert a[0] == b[0], f"record {i}: Debezium wrote to {a[0]}, mongocdc to {b[0]}"
        assert a[1] == b[1], f"record {i} ({a[0]}): keys differ {_first_difference(a[1], b[1])}"
        assert a[2] == b[2], f"record {i} ({a[0]}): values differ {_first_difference(a[2], b[2])}"
    assert len(left) == len(right), (
        f"Debezium wrote {len(left)} records, mongocdc {len(right)}; the extra ones: "
        f"{(left[len(right):] or right[len(left):])[:3]}"
    )


# -- comparing meaning (the default format) ---------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A BSON value without the distinctions one spelling keeps and the other loses (Int64 vs int)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, Int64):
        return int(value)
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, Binary) and value.subtype == 0:
        return bytes(value)
    if isinstance(value, Decimal128):
        return str(value)
    return value


_LOADS = json_util.JSONOptions(json_mode=json_util.JSONMode.RELAXED, tz_aware=False)


def _doc(text: str | None) -> Any:
    return None if text is None else _plain(json_util.loads(text, json_options=_LOADS))


def _transaction_id(text: str) -> str:
    """Debezium's ``<lsid JSON>:<n>`` and mongocdc's ``<uuid>:<n>`` as ``<uuid>:<n>``."""
    session, _, number = text.rpartition(":")
    if session.startswith("{"):
        lsid = json_util.loads(session, json_options=_LOADS)
        session = str(uuid.UUID(bytes=bytes(lsid["id"])))
    return f"{session}:{number}"


def meaning(topic: str, key: bytes | None, value: bytes | None) -> Any:
    """What a record says, without the documented spelling differences of the two formats:
    key and document spelling, source ``ts_*``/``rs``/``h``/``tord``/``stxnid``/``sequence``/
    ``version``, read markers other than ``last``, the envelope's ``ts_us``/``ts_ns``, the
    transaction id's spelling, ``data_collections`` names (``rs.db.coll`` vs ``db.coll``) and
    order, and BEGIN/END ``ts_ms``."""
    key_payload = json.loads(key) if key is not None else None
    if isinstance(key_payload, dict) and "schema" in key_payload:
        key_payload = key_payload["payload"]
    payload = json.loads(value) if value is not None else None
    if isinstance(payload, dict) and "schema" in payload:
        payload = payload["payload"]
    if topic.endswith(".transaction"):
        assert key_payload is not None and payload is not None
        collections = payload["data_collections"]
        return (topic, _transaction_id(key_payload["id"]), payload["status"], payload["event_count"],
                sorted((c["data_collection"].split(".", 1)[-1] if c["data_collection"].count(".") > 1
                        else c["data_collection"], c["event_count"]) for c in collections) if collections else None)
    doc_id = _doc('{"id": ' + key_payload["id"] + "}")["id"] if key_payload else None
    if payload is None:
        return (topic, repr(doc_id), None)
    source = payload["source"]
    desc = payload["updateDescription"]
    transaction = payload.get("transaction")
    return (
        topic,
        repr(doc_id),
        payload["op"],
        _doc(payload["before"]),
        _doc(payload["after"]),
        None if desc is None else (desc["removedFields"], _doc(desc["updatedFields"]) or None, desc["truncatedArrays"]),
        source["db"],
        source["collection"],
        source["snapshot"] if source["snapshot"] in ("false", "last", "incremental") else "read",
        source["ord"] if payload["op"] != "r" else None,
        _doc(source["lsid"]),
        source["txnNumber"],
        source["wallTime"],
        None if transaction is None else (_transaction_id(transaction["id"]), transaction["total_order"],
                                          transaction["data_collection_order"]),
    )


def assert_same_meaning(debezium: list[DebeziumRecord], mongocdc: list[Record]) -> None:
    left = [meaning(r.topic, r.key, r.value) for r in debezium]
    right = [meaning(r.topic, r.key, r.value) for r in mongocdc]
    for i, (a, b) in enumerate(zip(left, right, strict=False)):
        assert a == b, f"record {i} differs:\nDebezium: {a}\nmongocdc: {b}"
    assert len(left) == len(right), f"Debezium wrote {len(left)} records, mongocdc {len(right)}"


# -- the tests --------------------------------------------------------------------------------------------


@pytest.fixture
def need_debezium(debezium_version: str) -> Iterator[str]:
    reason = missing(debezium_version)
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so a missing Debezium build is an error, not a skip)")
        pytest.skip(reason)
    yield debezium_version


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_same_records_as_debezium(
    need_debezium: str, scenario: Scenario, mongo_client: MongoClient[Any], mongo_uri: str, tmp_path: Path
) -> None:
    """Snapshot then streaming of every key type, update operator, replace, delete, upsert and
    transaction: byte-identical in debezium_3x, the same data in the default format."""
    out = run_both(need_debezium, scenario, mongo_client, mongo_uri, tmp_path, load_snapshot_data, stream_workload)
    assert len(out.debezium) > 60  # the workload really ran through both
    assert_same_bytes(out.debezium, out.debezium_3x)
    assert_same_meaning(out.debezium, out.default)
    # Heartbeats come when time passes, so their number differs; each connector's are one record.
    for side in out.heartbeats.values():
        assert len(side) <= 1
    if all(out.heartbeats.values()):
        assert out.heartbeats["debezium"] == out.heartbeats["debezium_3x"]


def _decimal_ids_stream(client: MongoClient[Any]) -> bool:
    """Whether the replica set can put a Decimal128 ``_id`` into a resume token (mongod can)."""
    db = client["compat_decimal_probe"]
    try:
        with db.c.watch() as stream:
            db.c.insert_one({"_id": Decimal128("1.5")})
            stream.next()
        return True
    except OperationFailure:
        return False
    finally:
        client.drop_database("compat_decimal_probe")


def test_decimal128_ids_as_debezium(
    need_debezium: str, mongo_client: MongoClient[Any], mongo_uri: str, tmp_path: Path
) -> None:
    """Decimal128 ``_id``s in the snapshot and in the stream (a resume token must encode them)."""
    if not _decimal_ids_stream(mongo_client):
        pytest.xfail("the emulator cannot encode a Decimal128 _id in a resume token (getMore fails with "
                     "InternalError); the emulator fix of issue 11 makes this pass")
    scenario = Scenario("decimal", "change_streams_update_full", schemas=True, transactions=False, snapshot=True)

    def snapshot(db: Any) -> None:
        db.keys.insert_many([{"_id": Decimal128("-1")}, {"_id": Decimal128("2.50")}])

    def workload(client: MongoClient[Any], db: Any) -> None:
        db.keys.insert_one({"_id": Decimal128("3E+2")})
        db.keys.update_one({"_id": Decimal128("2.50")}, {"$set": {"x": 1}})
        db.keys.delete_one({"_id": Decimal128("-1")})

    out = run_both(need_debezium, scenario, mongo_client, mongo_uri, tmp_path, snapshot, workload)
    assert len(out.debezium) == 6
    assert_same_bytes(out.debezium, out.debezium_3x)
    assert_same_meaning(out.debezium, out.default)
