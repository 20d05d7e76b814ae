"""Debezium's event dispatcher: raw MongoDB documents -> records -> sink, and the offset context.

Sources hand raw documents here through the pipeline (they never import this module). The dispatcher converts them
(``EventConverter``), writes the records to the sink in batches, emits heartbeats, and records
offsets only after ``sink.flush()`` returned for every record written before them: a crash can
repeat records but never lose one.

An event the converter cannot turn into records, or a record the sink refuses for what it is
(``RecordRejected``), goes to ``event.processing.failure.handling.mode`` (``failures.py``): ``fail``
stops with an error naming the event and keeps the offset before it; ``warn`` and ``skip`` drop it
and move on.

With ``mongocdc.snapshot.delete.missing.keys`` a complete copy of a collection ends with a delete
event and a tombstone for every key the sink still holds that neither the copy read nor the stream
touched since it began (``begin_full_copies`` marks the sink, the final chunk reads it back).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson
from bson import Timestamp

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events import EventConverter, Record, ejson
from mongocdc_core.events.raw import RawChange, change_namespace, plain
from mongocdc_core.events.records import RecordRun
from mongocdc_core.events.transactions import Session
from mongocdc_core.failures import CHANGE_EVENT, SNAPSHOT_READ, FailedEvent, FailurePolicy, quote_key
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets import Offset, OffsetStore, SnapshotState
from mongocdc_core.positions import Position, token_timestamp
from mongocdc_core.receiver import ProgressListener, SnapshotChunk, StartPoint
from mongocdc_core.sinks.base import KeyReader, RecordRejected, Sink
from mongocdc_core.sinks.readback import key_id

__all__ = ["Dispatcher", "ProgressListener"]

log = logging.getLogger(__name__)


class Dispatcher:
    """Converts, batches, writes, heartbeats and commits offsets for one engine run."""

    def __init__(
        self,
        cfg: ConnectorConfig,
        converter: EventConverter,
        sink: Sink,
        offsets: OffsetStore | None,
        metrics: ConnectorMetrics,
        offset: Offset,
        *,
        progress: ProgressListener | None = None,
        flush_interval_s: float = 60.0,
        replica_set: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.converter = converter
        self.sink = sink
        self.offsets = offsets
        self.metrics = metrics
        self.offset = offset
        self.progress = progress
        self.flush_interval_s = flush_interval_s
        self.replica_set = replica_set  # saved offsets name their deployment (offset invalidation)
        self.heartbeat_interval_s = cfg.heartbeat_interval_ms / 1000
        self.batch_size = cfg.max_batch_size
        # Records not yet handed to the sink, in delivery order: a snapshot chunk's RecordRun stays one
        # piece (its records are made only if the sink takes them one by one); others join a list.
        self._pieces: list[Sequence[Record]] = []
        self._buffered = 0
        self._captured: dict[tuple[Any, Any], bool] = {}  # the filters' verdict per namespace
        self._last_commit = time.monotonic()
        self._last_heartbeat = time.monotonic()
        self._latest_token: dict[str, Any] | None = offset.resume_token
        self._dirty = False
        last = offset.position
        self._last_key: tuple[int, int] | None = (last.seconds, last.increment) if last else None
        self._ordinal = last.ordinal if last else 0
        self._txn: str | None = None
        self.events = 0
        self.counts: dict[str, int] = {"c": 0, "u": 0, "d": 0}
        self.first_position: Position | None = None
        self.last_event_position: Position | None = None
        self.last_position: Position | None = last
        self.records_written = 0
        self.snapshot_documents = 0
        self._snapshot_copied: dict[str, int] = {}
        self._snapshot_totals: dict[str, int | None] = {}
        self._snapshot_state: SnapshotState | None = None  # the initial or blocking snapshot being copied
        self._last_progress_report = 0.0
        self._unreported: dict[str, int] = {}  # events per op counted but not yet in the metrics
        self._last_event_seconds = 0
        self._last_event_token: dict[str, Any] | None = None  # the resume token of the last counted event
        self.failures = FailurePolicy(cfg.event_processing_failure_handling_mode, metrics)
        # Set when a record the sink refused stopped the run (fail mode): the offset has moved past
        # it, so no later commit may save that offset.
        self._undeliverable = False
        self._key_reader = sink if cfg.mongocdc_snapshot_delete_missing_keys and isinstance(sink, KeyReader) else None

    # -- writing and committing -----------------------------------------------------------------------

    def _write(self, records: Sequence[Record]) -> None:
        pieces = self._pieces
        if isinstance(records, RecordRun):
            pieces.append(records)
        elif pieces and type(pieces[-1]) is list:
            pieces[-1].extend(records)
        else:
            pieces.append(list(records))
        self._buffered += len(records)
        if self._buffered >= self.batch_size:
            self.drain()

    def write(self, records: list[Record]) -> None:
        """Deliver records produced outside the dispatcher (notifications) in stream order."""
        if records:
            self._write(records)

    def set_incremental(self, state: dict[str, Any] | None) -> None:
        """Record incremental snapshot progress in the offset (saved with the next commit)."""
        self.offset.incremental = state
        self._dirty = True

    def drain(self) -> None:
        """Hand buffered records to the sink (they are durable only after the next commit).

        A record the sink refuses goes to the failure policy; in ``warn``/``skip`` mode the records
        after it are written on.
        """
        self._report()
        pieces, self._pieces, self._buffered = self._pieces, [], 0
        for piece in pieces:
            batch = piece
            while batch:
                try:
                    self.sink.write(batch)
                except RecordRejected as rejected:
                    self.records_written += rejected.accepted
                    self._rejected(rejected)
                    batch = batch[rejected.accepted + 1:]
                    continue
                self.records_written += len(batch)
                break

    def _rejected(self, rejected: RecordRejected) -> None:
        record = rejected.record
        if record.op == "r":
            kind = SNAPSHOT_READ
        elif record.op is not None:
            kind = CHANGE_EVENT
        elif record.collection is not None:
            kind = "tombstone"
        else:
            kind = f"record for topic {record.topic}"
        event = FailedEvent(
            "deliver", kind, record.collection, quote_key(record.key) if record.key is not None else None,
            record.position if record.position != Position.MIN else None, str(rejected),
        )
        try:
            self.failures.failed(event)
        except Exception:
            self._undeliverable = True
            raise

    def commit(self) -> None:
        """Flush the sink, then save the offset (order matters: never record an undelivered position)."""
        self.drain()
        self.sink.flush()
        if self._undeliverable:
            return  # a refused record stopped the run: the offset must stay before it
        if self.offsets is not None and self._dirty:
            if self.replica_set is not None:
                self.offset.replica_set = self.replica_set
            self.offsets.save(self.offset)
        self._dirty = False
        self._last_commit = time.monotonic()

    def maybe_commit(self) -> None:
        """Commit when ``offset.flush.interval.ms`` elapsed since the last commit."""
        if time.monotonic() - self._last_commit >= self.flush_interval_s:
            self.commit()

    def finish(self) -> None:
        """End an open transaction (END record) and commit; for graceful stops and the end of a window."""
        self._write(self.converter.flush())
        self.commit()

    # -- snapshot -------------------------------------------------------------------------------------

    def snapshot_started(self, state: SnapshotState, totals: Mapping[str, int | None]) -> None:
        """Record that a snapshot is in progress (so an interrupted one is redone on restart)."""
        self.offset.snapshot = state
        self.offset.resume_token = state.start_token
        self.offset.position = state.start_position
        self._latest_token = state.start_token
        start = state.start_position
        # Events sharing the start's clusterTime sort after the reads (ordinal >= 1).
        self._last_key = (start.seconds, start.increment) if start is not None else None
        self._ordinal = 0
        self._begin_copy(state, totals)

    def blocking_started(self, state: SnapshotState, totals: Mapping[str, int | None]) -> None:
        """Record a blocking snapshot's request and progress; the stream position stays where it paused.

        Saved with the offset (one document), so a restart runs what is left of it before it
        streams on from the signal.
        """
        self.offset.blocking = state
        self._begin_copy(state, totals)

    def _begin_copy(self, state: SnapshotState, totals: Mapping[str, int | None]) -> None:
        self._snapshot_state = state
        self._snapshot_totals = dict(totals)
        self._snapshot_copied = dict.fromkeys(totals, 0)
        self._dirty = True
        self.commit()
        if self.progress is not None:
            self.progress.snapshot_started(totals)

    def prepare_chunk(self, chunk: SnapshotChunk, position: Position, read_at: datetime.datetime) -> SnapshotChunk:
        """The chunk with its read events, converted ahead of its turn: safe to call from several
        threads at once (the conversion keeps no state between chunks), so a copier's workers
        convert in parallel and only the delivery (:meth:`snapshot_chunk`) is in order. A chunk
        that fails to convert comes back as it was (``records`` None): its turn converts it again,
        read by read where it fails, for the policy. The records carry the time they were made.
        """
        db, _, coll = chunk.namespace.partition(".")
        try:
            records = self.converter.convert_reads(chunk.documents, chunk.markers, db, coll, position, read_at)
        except Exception:  # noqa: BLE001 - handled in order by snapshot_chunk
            return chunk
        return replace(chunk, records=records)

    def snapshot_chunk(self, chunk: SnapshotChunk, position: Position, read_at: datetime.datetime) -> None:
        """Read events for one chunk (converted here unless :meth:`prepare_chunk` did); when the
        collection is complete, flush and mark it done."""
        db, _, coll = chunk.namespace.partition(".")
        if chunk.records is not None:
            records = chunk.records
        else:
            try:
                records = self.converter.convert_reads(chunk.documents, chunk.markers, db, coll, position, read_at)
            except Exception:  # noqa: BLE001 - find the failing reads one by one, for the policy
                records = self._convert_reads_one_by_one(chunk, db, coll, position, read_at)
        self._write(records)
        if chunk.final:
            self._delete_missing_keys(chunk.namespace, position)
        n = len(records)
        self.snapshot_documents += n
        copied = self._snapshot_copied.get(chunk.namespace, 0) + n
        self._snapshot_copied[chunk.namespace] = copied
        if n:
            self.metrics.snapshot.rows(chunk.namespace, n, position.to_str())
            self.metrics.connection_restored(chunk.asked)  # documents were read: MongoDB answered
        state = self._snapshot_state
        if state is not None:
            state.record_part(chunk.namespace, chunk.part, chunk.after, chunk.part_done, chunk.final)
            self._dirty = True
        if chunk.final or chunk.part_done:
            self.commit()  # a finished range is never copied again, even after kill -9
        else:
            self.maybe_commit()  # bounds what kill -9 repeats inside a long range
        if chunk.final:
            self.metrics.snapshot.table_done()
            if self.progress is not None:
                self.progress.snapshot_collection_done(chunk.namespace, copied)
        elif self.progress is not None:
            self.progress.snapshot_progress(chunk.namespace, copied, self._snapshot_totals.get(chunk.namespace))

    def begin_full_copies(self, namespaces: Sequence[str]) -> None:
        """These namespaces are about to be copied whole, from their first document: mark where the sink
        stands (``mongocdc.snapshot.delete.missing.keys``; kept in the offset's snapshot state)."""
        state = self._snapshot_state  # the initial or blocking snapshot that was just started
        if self._key_reader is None or state is None:
            return
        self.commit()  # everything before the copy is delivered, and visible to a read-back
        fresh = [ns for ns in namespaces if ns not in state.marks]
        for namespace in fresh:
            db, _, coll = namespace.partition(".")
            state.marks[namespace] = self._key_reader.key_mark(self.converter.topic_for(db, coll))
        if fresh:
            self._dirty = True
            self.commit()

    def _delete_missing_keys(self, namespace: str, position: Position) -> None:
        """After the last chunk of a full copy: deletes for the keys downstream holds that nothing confirmed."""
        state = self._snapshot_state
        if self._key_reader is None or state is None or namespace not in state.marks:
            return
        mark = state.marks[namespace]
        if mark == 0 or (isinstance(mark, dict) and not any(mark.values())):
            return  # the sink held nothing of it before the copy (a first snapshot): nothing can be missing
        if "d" in self.cfg.skipped_operations:
            return  # deletes are not emitted at all (skipped.operations)
        self._dirty = True  # a transactional sink commits its records with the offset: make them readable
        self.commit()
        db, _, coll = namespace.partition(".")
        scan = self._key_reader.scan_keys(self.converter.topic_for(db, coll), mark, position)
        if scan is None:
            log.warning("the sink cannot tell which keys of %s it holds: no deletes for keys the snapshot did not "
                        "read (mongocdc.snapshot.delete.missing.keys)", namespace)
            return
        records: list[Record] = []
        cluster_time = Timestamp(position.seconds, position.increment)
        missing = scan.missing()
        for kid in missing:
            try:
                change = {"operationType": "delete", "ns": {"db": db, "coll": coll},
                          "documentKey": {"_id": ejson.loads(kid)}, "clusterTime": cluster_time}
                produced = self.converter.convert_change(change, position)
            except ValueError:
                produced = []
            if not produced or produced[-1].key is None or key_id(orjson.loads(produced[-1].key)) != kid:
                log.warning("cannot rebuild the key %s of %s to delete it", quote_key(kid), namespace)
                continue
            records += produced
        if records:
            log.info("snapshot of %s: %d keys the sink held were neither read nor changed since the snapshot began; "
                     "delete events emitted (mongocdc.snapshot.delete.missing.keys)", namespace, len(missing))
            self._write(records)

    def _convert_reads_one_by_one(
        self, chunk: SnapshotChunk, db: str, coll: str, position: Position, read_at: datetime.datetime
    ) -> list[Record]:
        """The chunk's records, each read that cannot be converted handed to the failure policy."""
        records = []
        documents = chunk.documents
        for i, marker in enumerate(chunk.markers):
            doc: Mapping[str, Any] | None = None
            try:
                doc = documents[i]  # a raw batch decodes here, one read at a time
                records.append(self.converter.convert_read(doc, db, coll, position, marker, read_at))
            except Exception as exc:  # noqa: BLE001 - any decoding or conversion failure is this read's
                key = quote_key(doc.get("_id")) if isinstance(doc, Mapping) else None
                event = FailedEvent("process", SNAPSHOT_READ, chunk.namespace, key, position, _cause(exc))
                self.failures.failed(event)
        return records

    def snapshot_finished(self, completed: bool) -> None:
        """Mark the snapshot done (streaming starts from its start token) and commit."""
        state = self.offset.snapshot
        if state is not None and completed:
            state.running = False
            self.offset.snapshot = None
        self._end_copy(completed)

    def blocking_finished(self, completed: bool) -> None:
        """A completed blocking snapshot leaves the offset; a stopped one stays for the restart."""
        if completed:
            self.offset.blocking = None
        self._end_copy(completed)

    def _end_copy(self, completed: bool) -> None:
        self._snapshot_state = None
        self._dirty = True
        self.commit()
        if self.progress is not None:
            self.progress.snapshot_finished(completed, self.snapshot_documents)

    # -- streaming ------------------------------------------------------------------------------------

    def start_at(self, start: StartPoint) -> None:
        """Record a streaming start point (no snapshot, no offset yet) and commit it."""
        self.offset.resume_token = start.token
        self.offset.position = start.position
        self._latest_token = start.token
        self.last_position = start.position
        self._last_key = (start.position.seconds, start.position.increment)
        self._ordinal = 0
        self._dirty = True
        self.commit()

    # -- streaming (events) ------------------------------------------------------------------------------------

    def _position(self, seconds: int, increment: int) -> Position:
        """clusterTime plus an ordinal counting the events that share it (a transaction's operations)."""
        key = (seconds, increment)
        if key == self._last_key:
            self._ordinal += 1
        else:
            self._last_key = key
            self._ordinal = 0
        return Position.from_cluster_time(seconds, increment, self._ordinal)

    def change(self, doc: Mapping[str, Any], token: dict[str, Any]) -> bool:
        """Dispatch one change event; True when it produced a data event (not filtered).

        The one place a change event is converted (``EventConverter.convert_change``) and its
        records handed on: a failure of either surfaces here, with the event and its position. An
        ordinary raw event (a :class:`RawChange` with a header) is never decoded on this path.
        """
        raw_header = doc.header if type(doc) is RawChange else None
        if raw_header is not None:
            db, coll, seconds, increment = raw_header.db, raw_header.coll, raw_header.seconds, raw_header.increment
        else:
            doc = plain(doc)
            db, coll = change_namespace(doc)
            stated = doc.get("clusterTime")
            cluster_time = stated if type(stated) is Timestamp else token_timestamp(token) or Timestamp(0, 0)
            seconds, increment = cluster_time.time, cluster_time.inc
        captured = self._captured.get((db, coll))
        if captured is None:
            captured = (
                isinstance(db, str)
                and isinstance(coll, str)
                and self.cfg.collection_included(db, coll)
                and not self.cfg.is_signal_collection(db, coll)
            )
            self._captured[(db, coll)] = captured
        position = self._position(seconds, increment)
        try:
            records = self.converter.convert_change(doc, position) if captured else []
        except Exception as exc:  # noqa: BLE001 - any conversion failure is this event's
            self._unprocessable(doc, position, exc)  # raises in fail mode: the offset stays before it
            self._advance(token, position)  # warn/skip: skipped, and the offset moves past it
            return False
        op = None
        for record in records:
            if record.op is not None:
                op = record.op
                break
        if records:
            self._write(records)
        # Only now may the offset move past this event: it was converted and handed to the sink.
        self._advance(token, position)
        if op is None:
            self.metrics.streaming.filtered()
            return False
        if raw_header is not None:
            assert isinstance(doc, RawChange)
            txn_number, lsid = raw_header.txn_number, self.converter.session_of(doc)
        else:
            txn_number, lsid = doc.get("txnNumber"), doc.get("lsid")
        self._count(op, position, seconds, lsid, txn_number, token)
        return True

    def _unprocessable(self, change: Mapping[str, Any], position: Position, exc: Exception) -> None:
        header = change.header if type(change) is RawChange else None
        try:
            doc = plain(change)
        except Exception:  # noqa: BLE001 - an event that does not decode (invalid UTF-8): what its header says
            doc = {} if header is None else {"operationType": header.op_type, "ns": {"db": header.db, "coll": header.coll}}
        ns = doc.get("ns")
        namespace = f"{ns.get('db')}.{ns.get('coll')}" if isinstance(ns, Mapping) else None
        document_key = doc.get("documentKey")
        key = quote_key(document_key.get("_id")) if isinstance(document_key, Mapping) else None
        kind = f"{doc.get('operationType')} {CHANGE_EVENT}" if isinstance(doc.get("operationType"), str) else CHANGE_EVENT
        self.failures.failed(FailedEvent("process", kind, namespace, key, position, _cause(exc)))

    def _count(
        self, op: str, position: Position, seconds: int, lsid: Session | None, txn_number: int | None,
        token: dict[str, Any],
    ) -> None:
        self.events += 1
        self.counts[op] = self.counts.get(op, 0) + 1
        unreported = self._unreported
        unreported[op] = unreported.get(op, 0) + 1
        if self.first_position is None:
            self.first_position = position
        self.last_event_position = position
        self._last_event_seconds = seconds
        self._last_event_token = token
        if lsid is not None or self._txn is not None:
            streaming = self.metrics.streaming
            txn = self.converter.transaction_id(lsid, txn_number) if lsid is not None else None
            if txn != self._txn:
                if self._txn is not None:
                    streaming.NumberOfCommittedTransactions += 1
                self._txn = txn
            if txn is not None:
                streaming.LastTransactionId = txn

    def _report(self) -> None:
        """Hand the events counted since the last report to the metrics and the progress listener:
        once per batch the pipeline takes (or per ``max.batch.size`` records), as a lock and a clock
        per event cost a tenth of the event's conversion."""
        if not self._unreported:
            return
        unreported, self._unreported = self._unreported, {}
        self.metrics.streaming.seen(unreported, self.last_event_position, self._last_event_seconds * 1000,
                                   self._last_event_token)
        if self.progress is not None:
            now = time.monotonic()
            if now - self._last_progress_report >= 0.2:
                self._last_progress_report = now
                self.progress.streaming_progress(self.events, self.counts, self.last_event_position)

    def _advance(self, token: dict[str, Any], position: Position) -> None:
        self._latest_token = token
        self.last_position = position
        self.offset.resume_token = token
        self.offset.position = position
        self._dirty = True

    def progress_token(self, token: Mapping[str, Any]) -> None:
        """A post-batch resume token: the stream scanned up to it. Offsets move with the next heartbeat.

        A transaction whose clusterTime the scan has passed is complete: its END is written now,
        not when the next event happens to arrive."""
        self._latest_token = dict(token)
        ts = token_timestamp(token)
        if ts is not None:
            self._end_transaction(self.converter.end_transaction_before(ts))

    def end_transaction_if_open(self) -> None:
        """Emit END for a transaction whose last event was dispatched (heartbeat or end of window)."""
        self._end_transaction(self.converter.flush())

    def _end_transaction(self, records: list[Record]) -> None:
        if records:
            self._write(records)
            if self._txn is not None:
                self.metrics.streaming.NumberOfCommittedTransactions += 1
                self._txn = None

    def heartbeat_if_due(self) -> None:
        """Every ``heartbeat.interval.ms``: a heartbeat record carrying the latest scanned position.

        This is what moves the offset forward while only uncaptured collections change, so a long
        quiet period does not let the stored position fall out of the oplog.
        """
        if self.heartbeat_interval_s <= 0:
            return
        now = time.monotonic()
        if now - self._last_heartbeat < self.heartbeat_interval_s:
            return
        self._last_heartbeat = now
        token = self._latest_token
        ts = token_timestamp(token)
        position = self.last_position
        if ts is not None:
            candidate = Position.from_timestamp(ts)
            if position is None or candidate > position:
                position = candidate
                self._last_key = (ts.time, ts.inc)
                self._ordinal = 0
        if position is None:
            return
        self.end_transaction_if_open()
        self._write([self.converter.heartbeat_record(position, int(time.time() * 1000))])
        if token is not None and token != self.offset.resume_token:
            self.offset.resume_token = token
            self.offset.position = position
            self.last_position = position
            self._dirty = True
        self.metrics.streaming.NumberOfHeartbeats += 1


def _cause(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}"
