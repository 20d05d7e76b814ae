"""Debezium's snapshot and streaming metrics, under Debezium's attribute names.

Debezium exposes these as JMX MBeans (``context=snapshot`` and ``context=streaming``); here they
are plain counters that the engine updates, readable in-process (``as_dict()``) and as a printable
``summary()``. Exporters (``json_file``, ``prometheus``) publish them; this module does no I/O.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from mongocdc_core.metrics.json_file import JsonFileExporter


class SnapshotMetrics:
    """``debezium.mongodb:type=connector-metrics,context=snapshot``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.LastEvent = ""
        self.last_event_monotonic: float | None = None
        self.TotalNumberOfEventsSeen = 0
        self.NumberOfEventsFiltered = 0
        self.CapturedTables: list[str] = []
        self.QueueTotalCapacity = 0
        self.QueueRemainingCapacity = 0
        self.MaxQueueSizeInBytes = 0
        self.CurrentQueueSizeInBytes = 0
        self.TotalTableCount = 0
        self.RemainingTableCount = 0
        self.SnapshotRunning = False
        self.SnapshotPaused = False
        self.SnapshotAborted = False
        self.SnapshotCompleted = False
        self.started_monotonic: float | None = None
        self.ended_monotonic: float | None = None
        self.SnapshotPausedDurationInSeconds = 0
        self.RowsScanned: dict[str, int] = {}
        self.NumberOfDisconnects = 0
        self.NumberOfErroneousEvents = 0

    def start(self, collections: Iterable[str]) -> None:
        with self._lock:
            self.CapturedTables = list(collections)
            self.TotalTableCount = len(self.CapturedTables)
            self.RemainingTableCount = self.TotalTableCount
            self.RowsScanned = {}
            self.SnapshotRunning = True
            self.SnapshotAborted = False
            self.SnapshotCompleted = False
            self.started_monotonic = time.monotonic()
            self.ended_monotonic = None

    def rows(self, namespace: str, count: int, last_event: str) -> None:
        with self._lock:
            self.RowsScanned[namespace] = self.RowsScanned.get(namespace, 0) + count
            self.TotalNumberOfEventsSeen += count
            self.LastEvent = last_event
            self.last_event_monotonic = time.monotonic()

    def table_done(self) -> None:
        with self._lock:
            self.RemainingTableCount = max(0, self.RemainingTableCount - 1)

    def erroneous(self) -> None:
        """One read could not be processed or delivered (``event.processing.failure.handling.mode``)."""
        with self._lock:
            self.NumberOfErroneousEvents += 1

    def finish(self, *, aborted: bool) -> None:
        with self._lock:
            self.SnapshotRunning = False
            self.SnapshotAborted = aborted
            self.SnapshotCompleted = not aborted
            self.ended_monotonic = time.monotonic()

    @property
    def SnapshotDurationInSeconds(self) -> int:  # noqa: N802 - Debezium's attribute name
        if self.started_monotonic is None:
            return 0
        end = self.ended_monotonic if self.ended_monotonic is not None else time.monotonic()
        return int(end - self.started_monotonic)

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            since = _millis_since(self.last_event_monotonic)
            return {
                "LastEvent": self.LastEvent,
                "MilliSecondsSinceLastEvent": since,
                "TotalNumberOfEventsSeen": self.TotalNumberOfEventsSeen,
                "NumberOfEventsFiltered": self.NumberOfEventsFiltered,
                "CapturedTables": list(self.CapturedTables),
                "QueueTotalCapacity": self.QueueTotalCapacity,
                "QueueRemainingCapacity": self.QueueRemainingCapacity,
                "MaxQueueSizeInBytes": self.MaxQueueSizeInBytes,
                "CurrentQueueSizeInBytes": self.CurrentQueueSizeInBytes,
                "TotalTableCount": self.TotalTableCount,
                "RemainingTableCount": self.RemainingTableCount,
                "SnapshotRunning": self.SnapshotRunning,
                "SnapshotPaused": self.SnapshotPaused,
                "SnapshotAborted": self.SnapshotAborted,
                "SnapshotCompleted": self.SnapshotCompleted,
                "SnapshotDurationInSeconds": self.SnapshotDurationInSeconds,
                "SnapshotPausedDurationInSeconds": self.SnapshotPausedDurationInSeconds,
                "RowsScanned": dict(self.RowsScanned),
                "NumberOfDisconnects": self.NumberOfDisconnects,
                "NumberOfErroneousEvents": self.NumberOfErroneousEvents,
            }


class StreamingMetrics:
    """``debezium.mongodb:type=connector-metrics,context=streaming``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_position: Any = None
        self._last_token: Any = None
        self._last_cluster_time_ms: int | None = None
        self._last_processed_ms = 0.0
        self.last_event_monotonic: float | None = None
        self.TotalNumberOfEventsSeen = 0
        self.TotalNumberOfCreateEventsSeen = 0
        self.TotalNumberOfUpdateEventsSeen = 0
        self.TotalNumberOfDeleteEventsSeen = 0
        self.NumberOfEventsFiltered = 0
        self.CapturedTables: list[str] = []
        self.QueueTotalCapacity = 0
        self.QueueRemainingCapacity = 0
        self.MaxQueueSizeInBytes = 0
        self.CurrentQueueSizeInBytes = 0
        self.Connected = False
        self.NumberOfCommittedTransactions = 0
        self.LastTransactionId = ""
        self.NumberOfDisconnects = 0
        self.NumberOfPrimaryElections = 0
        self.NumberOfHeartbeats = 0
        self.NumberOfErroneousEvents = 0

    def seen(self, counts: Mapping[str, int], position: Any, cluster_time_ms: int | None, resume_token: Any) -> None:
        """Count dispatched change events (``counts`` per op: c/u/d, others only in the total), the
        last of them at ``position``.

        Called once per dispatched batch, not per event. ``position`` and ``resume_token`` are kept
        as given and turned into text only when the metrics are read.
        """
        with self._lock:
            self.TotalNumberOfEventsSeen += sum(counts.values())
            self.TotalNumberOfCreateEventsSeen += counts.get("c", 0)
            self.TotalNumberOfUpdateEventsSeen += counts.get("u", 0)
            self.TotalNumberOfDeleteEventsSeen += counts.get("d", 0)
            self._last_position = position
            self._last_token = resume_token
            self.last_event_monotonic = time.monotonic()
            if cluster_time_ms is not None:
                self._last_cluster_time_ms = cluster_time_ms
                self._last_processed_ms = time.time() * 1000

    @property
    def LastEvent(self) -> str:  # noqa: N802 - Debezium's attribute name
        return "" if self._last_position is None else str(self._last_position)

    @property
    def SourceEventPosition(self) -> dict[str, str]:  # noqa: N802 - Debezium's attribute name
        if self._last_position is None:
            return {}
        return {"position": str(self._last_position), "resume_token": str(self._last_token)}

    @property
    def MilliSecondsBehindSource(self) -> int:  # noqa: N802 - Debezium's attribute name
        if self._last_cluster_time_ms is None:
            return -1
        return max(0, int(self._last_processed_ms - self._last_cluster_time_ms))

    def filtered(self, count: int = 1) -> None:
        with self._lock:
            self.NumberOfEventsFiltered += count

    def erroneous(self) -> None:
        """One event could not be processed or delivered (``event.processing.failure.handling.mode``)."""
        with self._lock:
            self.NumberOfErroneousEvents += 1

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "LastEvent": self.LastEvent,
                "MilliSecondsSinceLastEvent": _millis_since(self.last_event_monotonic),
                "TotalNumberOfEventsSeen": self.TotalNumberOfEventsSeen,
                "TotalNumberOfCreateEventsSeen": self.TotalNumberOfCreateEventsSeen,
                "TotalNumberOfUpdateEventsSeen": self.TotalNumberOfUpdateEventsSeen,
                "TotalNumberOfDeleteEventsSeen": self.TotalNumberOfDeleteEventsSeen,
                "NumberOfEventsFiltered": self.NumberOfEventsFiltered,
                "CapturedTables": list(self.CapturedTables),
                "QueueTotalCapacity": self.QueueTotalCapacity,
                "QueueRemainingCapacity": self.QueueRemainingCapacity,
                "MaxQueueSizeInBytes": self.MaxQueueSizeInBytes,
                "CurrentQueueSizeInBytes": self.CurrentQueueSizeInBytes,
                "Connected": self.Connected,
                "MilliSecondsBehindSource": self.MilliSecondsBehindSource,
                "NumberOfCommittedTransactions": self.NumberOfCommittedTransactions,
                "SourceEventPosition": dict(self.SourceEventPosition),
                "LastTransactionId": self.LastTransactionId,
                "NumberOfDisconnects": self.NumberOfDisconnects,
                "NumberOfPrimaryElections": self.NumberOfPrimaryElections,
                "NumberOfHeartbeats": self.NumberOfHeartbeats,
                "NumberOfErroneousEvents": self.NumberOfErroneousEvents,
            }


def _millis_since(mono: float | None) -> int:
    return -1 if mono is None else int((time.monotonic() - mono) * 1000)


class ConnectorMetrics:
    """Both metric groups of one connector, plus the periodic JSON file writer.

    ``tags`` are ``custom.metric.tags``: every exporter names the metrics with them (appended to the
    MBean name in the JSON file, as Debezium does; labels in Prometheus).
    """

    def __init__(self, server: str, tags: Mapping[str, str] | None = None) -> None:
        self.server = server
        self.tags = dict(tags or {})
        self.snapshot = SnapshotMetrics()
        self.streaming = StreamingMetrics()
        self._connection_lock = threading.Lock()
        self._reachable = False  # MongoDB answered since the last loss (nothing is lost before a first answer)
        #: The losses counted so far: read as the connector asks MongoDB something, and handed with the
        #: answer to :meth:`connection_restored` (an int, read without the lock).
        self.losses = 0
        self._election_ids: dict[str, Any] = {}  # the highest electionId seen per replica set
        self._file: JsonFileExporter | None = None

    def as_dict(self) -> dict[str, Any]:
        """Debezium's MBean names as keys, attribute maps as values."""
        return {self.mbean_name(context): values for context, values in self.contexts().items()}

    def contexts(self) -> dict[str, dict[str, Any]]:
        """The attribute maps by Debezium context (``snapshot``, ``streaming``)."""
        return {"snapshot": self.snapshot.as_dict(), "streaming": self.streaming.as_dict()}

    def mbean_name(self, context: str) -> str:
        """Debezium's MBean name of one context, ``custom.metric.tags`` appended."""
        tags = "".join(f",{key}={value}" for key, value in self.tags.items())
        return f"debezium.mongodb:type=connector-metrics,context={context},server={self.server},task=0{tags}"

    def connection_restored(self, asked: int | None) -> None:
        """MongoDB answered the connector again. ``asked``: :attr:`losses` when the question was sent; the
        answer to a question sent before the last loss was counted ends nothing (a reply read just as the
        server went away, while the driver's monitor already reported the loss; a snapshot's batch read
        ahead before the loss and handed over after it). None: an answer that is taken as new (a heartbeat
        with a new ``topologyVersion``; documents read by a copier without metrics)."""
        with self._connection_lock:
            if asked is None or asked == self.losses:
                self._reachable = True

    def connection_lost(self) -> None:
        """The connector lost MongoDB: ``NumberOfDisconnects`` counts the first report of each loss (the
        driver's or the change stream's, whichever comes first), in the snapshot context while a snapshot
        runs and in the streaming context otherwise; reports until ``connection_restored`` are the same loss."""
        with self._connection_lock:
            if not self._reachable:
                return
            self._reachable = False
            self.losses += 1
            context = self.snapshot if self.snapshot.SnapshotRunning else self.streaming
            context.NumberOfDisconnects += 1

    def primary_seen(self, replica_set: str, election_id: Any) -> None:
        """A primary of ``replica_set`` reported ``election_id`` (mongod's: the term, rising with every
        election): ``NumberOfPrimaryElections`` counts each one higher than any seen before in this run,
        whichever client or member reported it."""
        with self._connection_lock:
            seen = self._election_ids.get(replica_set)
            if seen is not None and election_id > seen:
                self.streaming.NumberOfPrimaryElections += 1
            if seen is None or election_id > seen:
                self._election_ids[replica_set] = election_id

    def write_file(self, path: str | os.PathLike[str]) -> None:
        """Replace ``path`` atomically with the current metrics as JSON."""
        JsonFileExporter(self.as_dict, path).write()

    def start_file_writer(self, path: str | os.PathLike[str], interval_s: float = 2.0) -> None:
        """Rewrite ``path`` every ``interval_s`` seconds until ``stop_file_writer``."""
        if self._file is None:
            self._file = JsonFileExporter(self.as_dict, path, interval_s)
            self._file.start()

    def stop_file_writer(self, path: str | os.PathLike[str] | None) -> None:
        """Stop the writer and write the final values once more."""
        if self._file is not None:
            self._file.stop()
            self._file = None
        if path is not None:
            self.write_file(path)

    def summary(self) -> str:
        """A few human-readable lines for the end of a run."""
        snap = self.snapshot.as_dict()
        stream = self.streaming.as_dict()
        lines = []
        if snap["TotalTableCount"]:
            state = "completed" if snap["SnapshotCompleted"] else ("aborted" if snap["SnapshotAborted"] else "running")
            lines.append(
                f"snapshot: {state}, {snap['TotalTableCount']} collections, "
                f"{snap['TotalNumberOfEventsSeen']} documents in {snap['SnapshotDurationInSeconds']} s"
            )
            for ns, rows in sorted(snap["RowsScanned"].items()):
                lines.append(f"  {ns}: {rows} rows")
        lines.append(
            f"streaming: {stream['TotalNumberOfEventsSeen']} events (create {stream['TotalNumberOfCreateEventsSeen']}, "
            f"update {stream['TotalNumberOfUpdateEventsSeen']}, delete {stream['TotalNumberOfDeleteEventsSeen']}), "
            f"{stream['NumberOfEventsFiltered']} filtered, {stream['NumberOfCommittedTransactions']} transactions, "
            f"{stream['NumberOfHeartbeats']} heartbeats"
        )
        disconnects = snap["NumberOfDisconnects"] + stream["NumberOfDisconnects"]
        lines.append(
            f"connection: {disconnects} disconnects (snapshot {snap['NumberOfDisconnects']}, streaming "
            f"{stream['NumberOfDisconnects']}), {stream['NumberOfPrimaryElections']} primary elections"
        )
        if stream["LastEvent"]:
            lines.append(f"last position: {stream['LastEvent']}")
        return "\n".join(lines)
