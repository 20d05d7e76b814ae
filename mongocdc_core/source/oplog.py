"""The oplog window and the "is my position still in it" check.

A change stream can only resume from a position the oplog still holds. Checking the stored
offset against the window before streaming (and recognising ChangeStreamHistoryLost while
streaming) turns a would-be silent gap into either a new snapshot (``when_needed``) or a clear
error that explains the recovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.positions import token_timestamp
from mongocdc_core.source.connection import Topology, one_line, open_shard_client, shard_hosts

__all__ = ["OplogWindow", "OplogWindows", "current_cluster_time", "is_history_lost", "oplog_window", "oplog_windows",
           "position_lost", "token_timestamp"]

CHANGE_STREAM_HISTORY_LOST = 286
INVALID_RESUME_TOKEN = 260
CAPPED_POSITION_LOST = 136  # an open cursor whose oplog position was purged under it


@dataclass(frozen=True)
class OplogWindow:
    """First and last oplog entry times, the oplog's size and its cap."""

    first: Timestamp
    last: Timestamp
    size_bytes: int
    max_bytes: int | None
    hours: float

    def contains(self, ts: Timestamp) -> bool:
        """Whether a stream can resume at ``ts`` (the entry at ``ts`` or later is still there)."""
        return (ts.time, ts.inc) >= (self.first.time, self.first.inc)


def oplog_window(client: MongoClient[Any]) -> OplogWindow | None:
    """Read ``local.oplog.rs``; None where it is not readable (through mongos, or not authorized)."""
    oplog = client.local["oplog.rs"]
    try:
        first = oplog.find_one({}, {"ts": 1}, sort=[("$natural", 1)])
        last = oplog.find_one({}, {"ts": 1}, sort=[("$natural", -1)])
    except OperationFailure:
        return None
    if not first or not last:
        return None
    size, max_size = 0, None
    try:
        stats = client.local.command("collStats", "oplog.rs")
        size = int(stats.get("size", 0))
        max_size = int(stats["maxSize"]) if stats.get("maxSize") else None
    except PyMongoError:
        pass
    hours = max(0, last["ts"].time - first["ts"].time) / 3600
    return OplogWindow(first["ts"], last["ts"], size, max_size, hours)


@dataclass(frozen=True)
class OplogWindows:
    """The oplog window of every replica set the connector's change streams read, by name: the replica set,
    or each shard of a sharded cluster (read from the shard directly: mongos has no ``local``)."""

    windows: dict[str, OplogWindow]
    unreadable: dict[str, str]  # name -> why its oplog could not be read
    sharded: bool = False  # names are shards

    @property
    def common(self) -> OplogWindow | None:
        """The window a stream can resume in: from the latest first entry (a stream through mongos needs the
        history of every shard); sizes summed. None when no oplog was readable."""
        if not self.windows:
            return None
        found = list(self.windows.values())
        first = max((w.first for w in found), key=lambda ts: (ts.time, ts.inc))
        last = max((w.last for w in found), key=lambda ts: (ts.time, ts.inc))
        caps = [w.max_bytes for w in found]
        total_cap = None if any(c is None for c in caps) else sum(c for c in caps if c is not None)
        return OplogWindow(first, last, sum(w.size_bytes for w in found), total_cap,
                           max(0, last.time - first.time) / 3600)


def oplog_windows(cfg: ConnectorConfig, client: MongoClient[Any], topology: Topology) -> OplogWindows:
    """The replica set's oplog window, or through mongos each shard's (shards from ``config.shards``, each
    reached with the connector's credentials and TLS options, as Debezium connects to shards)."""
    if topology.kind != "sharded":
        window = oplog_window(client)
        name = topology.source_name
        if window is None:
            return OplogWindows({}, {name: "local.oplog.rs is not readable or empty (missing privileges?)"})
        return OplogWindows({name: window}, {})
    try:
        hosts = shard_hosts(client)
    except PyMongoError as exc:
        return OplogWindows({}, {"cluster": f"config.shards is not readable: {one_line(exc)}"}, sharded=True)
    windows: dict[str, OplogWindow] = {}
    unreadable: dict[str, str] = {}
    for shard, host in sorted(hosts.items()):
        try:
            shard_client = open_shard_client(cfg, host)
        except PyMongoError as exc:  # e.g. an option pymongo refuses on a plain mongodb:// string
            unreadable[shard] = f"{host}: {one_line(exc)}"
            continue
        try:
            window = oplog_window(shard_client)
        except PyMongoError as exc:
            unreadable[shard] = f"{host}: {one_line(exc)}"
            continue
        finally:
            shard_client.close()
        if window is None:
            unreadable[shard] = f"{host}: local.oplog.rs is not readable or empty (missing privileges?)"
        else:
            windows[shard] = window
    return OplogWindows(windows, unreadable, sharded=True)


def current_cluster_time(client: MongoClient[Any]) -> Timestamp:
    """The deployment's current clusterTime (what a snapshot started now is consistent with)."""
    reply = client.admin.command("hello")
    cluster = reply.get("$clusterTime", {}).get("clusterTime")
    if isinstance(cluster, Timestamp):
        return cluster
    op_time = reply.get("operationTime") or reply.get("lastWrite", {}).get("opTime", {}).get("ts")
    if isinstance(op_time, Timestamp):
        return op_time
    window = oplog_window(client)
    if window is None:
        raise RuntimeError("the server reported no clusterTime and its oplog is not readable")
    return window.last


def oplog_first(client: MongoClient[Any]) -> Timestamp | None:
    """Time of the oldest oplog entry; None where the oplog is not readable."""
    try:
        first = client.local["oplog.rs"].find_one({}, {"ts": 1}, sort=[("$natural", 1)])
    except OperationFailure:
        return None
    return first["ts"] if first else None


def position_lost(client: MongoClient[Any], ts: Timestamp | None) -> tuple[bool, Timestamp | None]:
    """Whether ``ts`` has left the oplog, and the oplog's first time (None if unknown).

    Reads only the oldest entry (no ``collStats``): it runs at every start and every clean stop.
    """
    if ts is None:
        return False, None
    first = oplog_first(client)
    if first is None:
        return False, None
    return (ts.time, ts.inc) < (first.time, first.inc), first


def is_history_lost(exc: BaseException) -> bool:
    """ChangeStreamHistoryLost, CappedPositionLost, or a resume token the server no longer recognises."""
    return isinstance(exc, OperationFailure) and exc.code in (
        CHANGE_STREAM_HISTORY_LOST,
        INVALID_RESUME_TOKEN,
        CAPPED_POSITION_LOST,
    )
