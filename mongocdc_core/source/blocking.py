"""Blocking snapshots, and the coordinator that wires every ad hoc snapshot piece into the engine.

A blocking snapshot is requested by a signal and run by the capture pipeline: the pipeline pauses
streaming right after the signal's event (the change stream reader keeps filling its bounded
queue and then waits), copies the collections like an initial snapshot (the same copier: ``_id``
ranges in parallel, ``source.snapshot`` markers ``first``/``true``/``last``…), and resumes
streaming exactly where it paused. Filters are the signal's ``additional-conditions`` (else
``snapshot.collection.filter.overrides``); reads take the position recorded just before the copy
started. Nothing here knows the dispatcher: :class:`BlockingSnapshot` is the request plus its
notifications.

Resumable: the request and the progress of its ranges are part of the connector's offset
(``Offset.blocking``, saved in the same document as the stream position, which stays at the
signal while the snapshot runs). After a stop, ``kill -9``, a lost connection or a failed sink,
the next run copies only the ranges not yet done, with the same reads' position and markers,
before it streams on from the signal: after a graceful stop no record is delivered twice, after
``kill -9`` at most the ranges being copied repeat.

Possible duplicates (the seed's warning, and what a consumer sees): time passes between the
signal being written and the copy starting, and the stream paused at the signal, not at the copy.
Every change made in between (and during the copy) is already reflected in the reads *and* is
streamed again once streaming resumes, so a document can appear as a read and then again as the
create/update/delete that produced it. Consumers must treat records idempotently: the record with
the highest position per key is the current state, and replaying in delivery order converges to
the source.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from bson import Timestamp
from pymongo import MongoClient

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.offsets.model import SnapshotState
from mongocdc_core.positions import Position
from mongocdc_core.receiver import SnapshotChunk, SnapshotReceiver
from mongocdc_core.source.incremental import (
    READ_ONLY,
    IncrementalSnapshotter,
    IncrementalState,
    ReceiverOutput,
)
from mongocdc_core.source.signals import (
    CHANNEL_FILE,
    CHANNEL_KAFKA,
    CHANNEL_SOURCE,
    WATERMARK_TYPES,
    FileSignalChannel,
    LogNotifier,
    Notifier,
    SignalError,
    SignalProcessor,
)
from mongocdc_core.source.snapshot import captured_collections, collection_filter, record_start
from mongocdc_core.source.stream import watch_target

if TYPE_CHECKING:
    from mongocdc_core.source.signals_kafka import KafkaSignalChannel

log = logging.getLogger("mongocdc.blocking")

AGGREGATE = "Initial Snapshot"


class BlockingSnapshot:
    """One blocking snapshot: a signal's request, or one a restart found unfinished in the offsets.

    The capture pipeline runs it with streaming paused: :meth:`prepare` gives the progress to copy
    into (new, or the stored one), and :meth:`started`, :meth:`on_chunk` and :meth:`finished`
    report it (Debezium's notifications; the pipeline keeps the snapshot metrics, as for every snapshot).
    """

    def __init__(
        self,
        cfg: ConnectorConfig,
        notifier: Notifier,
        signal_id: str,
        namespaces: Sequence[str],
        filters: Mapping[str, dict[str, Any]],
        *,
        resumed: SnapshotState | None = None,
    ) -> None:
        self.cfg = cfg
        self.notifier = notifier
        self.signal_id = signal_id
        self.namespaces = list(namespaces)
        self.filters = {ns: dict(q) for ns, q in filters.items()}
        self.resumed = resumed
        self._rows: dict[str, int] = {}

    @classmethod
    def resume(cls, cfg: ConnectorConfig, notifier: Notifier, state: SnapshotState) -> BlockingSnapshot:
        """The unfinished blocking snapshot recorded in the offsets."""
        return cls(cfg, notifier, state.signal_id or "", state.collections, {}, resumed=state)

    def prepare(self, client: MongoClient[Any]) -> SnapshotState:
        """The progress to copy into: the stored one, or a new one starting now (position first)."""
        if self.resumed is not None:
            return self.resumed
        start = record_start(client, watch_target(client, self.cfg))
        return SnapshotState(
            collections=list(self.namespaces),
            start_position=start.position,
            start_token=start.token,
            signal_id=self.signal_id,
            filters={
                ns: dict(self.filters[ns]) if ns in self.filters else collection_filter(self.cfg, ns)
                for ns in self.namespaces
            },
        )

    def started(self, state: SnapshotState) -> None:
        remaining = state.remaining
        resumed = self.resumed is not None
        log.info(
            "signal %s: blocking snapshot of %s %s; streaming pauses", self.signal_id or "?", ", ".join(remaining),
            "resumes" if resumed else "starts",
        )
        self._notify("STARTED", {"data_collections": ",".join(remaining), **({"resumed": "true"} if resumed else {})})

    def on_chunk(self, chunk: SnapshotChunk) -> None:
        """A chunk was delivered; the end of a collection is reported."""
        self._rows[chunk.namespace] = self._rows.get(chunk.namespace, 0) + len(chunk.documents)
        if chunk.final:
            rows = self._rows[chunk.namespace]
            self._notify("TABLE_SCAN_COMPLETED", {
                "data_collection": chunk.namespace, "scanned_collection": chunk.namespace,
                "total_rows_scanned": str(rows), "status": "SUCCEEDED" if rows else "EMPTY",
            })

    def finished(self, completed: bool, position: Position | None) -> None:
        """The copy ended: completed, stopped (resumed by the next run) or failed."""
        self._notify("COMPLETED" if completed else "ABORTED", {})
        log.info("blocking snapshot of %s %s at %s", ", ".join(self.namespaces),
                 "completed" if completed else "stopped (the next run resumes it)", position)

    def _notify(self, kind: str, data: Mapping[str, str]) -> None:
        self.notifier.notify(AGGREGATE, kind, {"connector_name": self.cfg.topic_prefix, **data})


class AdHocSnapshots:
    """Everything ad hoc for one engine run: signal channels, incremental and blocking snapshots.

    The capture pipeline calls :meth:`on_signal` for each event of the signaling collection and
    :meth:`on_stream_event` for each captured data event (after dispatching it), :meth:`process`
    once per loop iteration, :meth:`take_blocking` for a requested blocking snapshot (which the
    pipeline runs with streaming paused), and :meth:`close` when streaming ends. Other signal
    channels (Kafka, file) hand parsed signals to ``processor.submit``. A blocking snapshot left
    unfinished in the offsets (``stored_blocking``) is the first one :meth:`take_blocking` gives.
    """

    def __init__(
        self,
        client: MongoClient[Any],
        cfg: ConnectorConfig,
        receiver: SnapshotReceiver,
        metrics: ConnectorMetrics,
        notifier: Notifier | None,
        *,
        stored_incremental: dict[str, Any] | None = None,
        stored_blocking: SnapshotState | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.notifier: Notifier = notifier or LogNotifier(cfg.topic_prefix)
        self._blocking_requests: list[BlockingSnapshot] = []
        if stored_blocking is not None and stored_blocking.running:
            self._blocking_requests.append(BlockingSnapshot.resume(cfg, self.notifier, stored_blocking))
        self.channels = tuple(cfg.signal_enabled_channels)
        self.incremental: IncrementalSnapshotter | None = None
        if cfg.signal_data_collection or cfg.incremental_snapshot_watermarking_strategy == READ_ONLY:
            self.incremental = IncrementalSnapshotter(
                client, cfg, ReceiverOutput(receiver), notifier=self.notifier, metrics=metrics.snapshot, connection=metrics,
                state=IncrementalState.from_json(stored_incremental) if stored_incremental else None,
            )
        self.processor = SignalProcessor(
            self, self.notifier, lambda: captured_collections(client, cfg), self._blocking,
            connector_name=cfg.topic_prefix,
        )
        self.file_channel: FileSignalChannel | None = None
        if CHANNEL_FILE in self.channels:
            self.file_channel = FileSignalChannel(cfg.signal_file, cfg.signal_poll_interval_ms / 1000, self.processor)
            self.file_channel.start()
        self.kafka_channel: KafkaSignalChannel | None = None
        if CHANNEL_KAFKA in self.channels:
            from mongocdc_core.source.signals_kafka import KafkaSignalChannel  # noqa: PLC0415 - needs confluent-kafka

            self.kafka_channel = KafkaSignalChannel(cfg, self.processor.submit, self.processor.reject)
            self.kafka_channel.start()

    # -- dispatcher hooks ------------------------------------------------------------------------------

    def on_signal(self, change: Mapping[str, Any], position: Position) -> None:
        """An insert/delete in the signaling collection: a watermark, or a signal (source channel)."""
        if self.incremental is not None and self.incremental.on_signal_event(change, position):
            return
        if change.get("operationType") != "insert" or CHANNEL_SOURCE not in self.channels:
            return
        document = change.get("fullDocument")
        if not isinstance(document, Mapping):
            self.processor.reject(CHANNEL_SOURCE, "signal event carries no document (fullDocument)")
            return
        if document.get("type") in WATERMARK_TYPES:
            return  # a window of another run (e.g. a standalone snapshot) or of a previous process
        self.processor.receive_document(document, CHANNEL_SOURCE)
        # Act right at the signal's place in the stream: a blocking snapshot is queued here and the
        # pipeline runs it before it dispatches the next event.
        self.processor.process()

    def on_stream_event(self, namespace: str, document_key: Any, position: Position) -> bool:
        return self.incremental is not None and self.incremental.on_stream_event(namespace, document_key, position)

    def on_stream_passed(self, upto: Timestamp, last: Position | None) -> None:
        if self.incremental is not None:
            self.incremental.on_stream_passed(upto, last)

    def process(self) -> None:
        """Execute queued signals; re-raise an incremental worker's failure."""
        self.processor.process()
        if self.incremental is not None:
            self.incremental.poll()

    @property
    def watching(self) -> bool:
        return self.incremental is not None and self.incremental.watching

    @property
    def busy(self) -> bool:
        """An incremental snapshot is running (an idle stream is not "done" yet)."""
        return self.incremental is not None and self.incremental.running and not self._paused()

    def _paused(self) -> bool:
        state = self.incremental.state if self.incremental is not None else None
        return state is not None and state.paused

    def close(self) -> None:
        """Stop the channels and the incremental workers (progress stays in the offset)."""
        if self.kafka_channel is not None:
            self.kafka_channel.stop()
        if self.file_channel is not None:
            self.file_channel.stop()
            self.file_channel.join(timeout=5)
        if self.incremental is not None:
            self.incremental.shutdown()

    # -- SnapshotControl for the processor -------------------------------------------------------------

    def _require(self) -> IncrementalSnapshotter:
        if self.incremental is None:
            raise SignalError(
                "incremental snapshots need signal.data.collection (the watermarks are written there), or "
                "incremental.snapshot.watermarking.strategy=read_only"
            )
        return self.incremental

    def start(self, signal_id: str, namespaces: Sequence[str], filters: Mapping[str, dict[str, Any]]) -> None:
        self._require().start(signal_id, namespaces, filters)

    def stop(self, namespaces: Sequence[str] | None) -> list[str]:
        return self._require().stop(namespaces)

    def pause(self) -> bool:
        return self._require().pause()

    def resume(self) -> bool:
        return self._require().resume()

    def collections(self) -> list[str]:
        return self.incremental.collections() if self.incremental is not None else []

    def _blocking(self, signal_id: str, namespaces: list[str], filters: dict[str, dict[str, Any]]) -> None:
        """Queue the request: it runs on the pipeline's thread, never from inside a dispatch."""
        self._blocking_requests.append(BlockingSnapshot(self.cfg, self.notifier, signal_id, namespaces, filters))

    def take_blocking(self) -> BlockingSnapshot | None:
        """The oldest blocking snapshot to run (an unfinished one from the offsets first)."""
        return self._blocking_requests.pop(0) if self._blocking_requests else None
