"""Blocking snapshots, and the coordinator that wires every ad hoc snapshot piece into the engine.

A blocking snapshot is requested by a signal and run by the capture pipeline: the pipeline pauses
streaming right after the signal's event (the change stream reader keeps filling its bounded
queue and then waits), runs the copy through :meth:`AdHocSnapshots.run_blocking`, and resumes
streaming exactly where it paused. Nothing here knows the dispatcher: reads go to a
:class:`~mongocdc_core.receiver.SnapshotReceiver`. The copy works like an initial snapshot (parallel
collections, ``source.snapshot`` markers ``first``/``true``/``last``…), with the signal's
``additional-conditions`` (else ``snapshot.collection.filter.overrides``) as filters. Its reads
take the position recorded just before the copy started.

Possible duplicates (the seed's warning, and what a consumer sees): time passes between the
signal being written and the copy starting, and the stream paused at the signal, not at the copy.
Every change made in between (and during the copy) is already reflected in the reads *and* is
streamed again once streaming resumes, so a document can appear as a read and then again as the
create/update/delete that produced it. Consumers must treat records idempotently: the record with
the highest position per key is the current state, and replaying in delivery order converges to
the source. If the connector stops during a blocking snapshot, the snapshot is not resumed on
restart; send the signal again.
"""

from __future__ import annotations

import datetime
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pymongo import MongoClient

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.positions import Position
from mongocdc_core.receiver import SnapshotChunk, SnapshotReceiver
from mongocdc_core.source.incremental import IncrementalSnapshotter, IncrementalState, ReceiverOutput
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
from mongocdc_core.source.snapshot import (
    SnapshotCopier,
    captured_collections,
    collection_filter,
    record_start,
)
from mongocdc_core.source.stream import watch_target

if TYPE_CHECKING:
    from mongocdc_core.source.signals_kafka import KafkaSignalChannel

log = logging.getLogger("mongocdc.blocking")

AGGREGATE = "Initial Snapshot"


@dataclass(frozen=True)
class BlockingRequest:
    """A blocking snapshot a signal asked for; the pipeline runs it with streaming paused."""

    signal_id: str
    namespaces: list[str]
    filters: dict[str, dict[str, Any]]


def run_blocking_snapshot(
    client: MongoClient[Any],
    cfg: ConnectorConfig,
    receiver: SnapshotReceiver,
    metrics: ConnectorMetrics,
    namespaces: Sequence[str],
    filters: Mapping[str, dict[str, Any]],
    *,
    notifier: Notifier,
    stop: threading.Event,
) -> bool:
    """Copy ``namespaces`` into ``receiver`` (streaming waits); False when ``stop`` ended it early.

    See the module docstring for the duplicates this can produce.
    """
    start = record_start(client, watch_target(client, cfg))
    position: Position = start.position
    query = {ns: dict(filters[ns]) if ns in filters else collection_filter(cfg, ns) for ns in namespaces}
    snap = metrics.snapshot
    snap.start(namespaces)
    name = {"connector_name": cfg.topic_prefix}
    notifier.notify(AGGREGATE, "STARTED", {**name, "data_collections": ",".join(namespaces)})
    copied: dict[str, int] = dict.fromkeys(namespaces, 0)
    receiver.begin_full_copies([ns for ns in namespaces if not query[ns]])

    def emit(chunk: SnapshotChunk) -> bool:
        if stop.is_set():
            return False
        receiver.snapshot_chunk(chunk, position, datetime.datetime.now(datetime.UTC))
        copied[chunk.namespace] += len(chunk.documents)
        if chunk.final:
            snap.table_done()
            notifier.notify(AGGREGATE, "TABLE_SCAN_COMPLETED", {
                **name, "data_collection": chunk.namespace, "scanned_collection": chunk.namespace,
                "total_rows_scanned": str(copied[chunk.namespace]),
                "status": "SUCCEEDED" if copied[chunk.namespace] else "EMPTY",
            })
        return True

    copier = SnapshotCopier(
        client, cfg, list(namespaces), emit, threads=cfg.snapshot_max_threads,
        chunk_size=min(cfg.max_batch_size, 1024), filters=query, stop=threading.Event(),
    )
    forward = threading.Thread(target=_forward, args=(stop, copier.stop), daemon=True)
    forward.start()
    try:
        completed = copier.run()
    except BaseException:
        snap.finish(aborted=True)
        notifier.notify(AGGREGATE, "ABORTED", name)
        raise
    finally:
        copier.stop.set()
    receiver.commit()
    snap.finish(aborted=not completed)
    notifier.notify(AGGREGATE, "COMPLETED" if completed else "ABORTED", name)
    log.info("blocking snapshot of %s %s at %s", ", ".join(namespaces), "completed" if completed else "stopped", position)
    return completed


def _forward(source: threading.Event, target: threading.Event) -> None:
    """Propagate the engine's stop to the copier until the copy is over."""
    while not target.is_set():
        if source.wait(0.1):
            target.set()


class AdHocSnapshots:
    """Everything ad hoc for one engine run: signal channels, incremental and blocking snapshots.

    The capture pipeline calls :meth:`on_signal` for each event of the signaling collection and
    :meth:`on_stream_event` for each captured data event (after dispatching it), :meth:`process`
    once per loop iteration, :meth:`take_blocking` / :meth:`run_blocking` to run a requested
    blocking snapshot with streaming paused, and :meth:`close` when streaming ends. Other signal
    channels (Kafka, file) hand parsed signals to ``processor.submit``.
    """

    def __init__(
        self,
        client: MongoClient[Any],
        cfg: ConnectorConfig,
        receiver: SnapshotReceiver,
        metrics: ConnectorMetrics,
        notifier: Notifier | None,
        stop: threading.Event,
        *,
        stored_incremental: dict[str, Any] | None = None,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.receiver = receiver
        self.metrics = metrics
        self._blocking_requests: list[BlockingRequest] = []
        self.notifier: Notifier = notifier or LogNotifier(cfg.topic_prefix)
        self.stop_event = stop
        self.channels = tuple(cfg.signal_enabled_channels)
        self.incremental: IncrementalSnapshotter | None = None
        if cfg.signal_data_collection:
            self.incremental = IncrementalSnapshotter(
                client, cfg, ReceiverOutput(receiver), notifier=self.notifier, metrics=metrics.snapshot,
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

    def process(self) -> None:
        """Execute queued signals; re-raise an incremental worker's failure."""
        self.processor.process()
        if self.incremental is not None:
            self.incremental.poll()

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
            raise SignalError("incremental snapshots need signal.data.collection (the watermarks are written there)")
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
        self._blocking_requests.append(BlockingRequest(signal_id, list(namespaces), dict(filters)))

    def take_blocking(self) -> BlockingRequest | None:
        """The oldest blocking snapshot a signal requested and nobody ran yet."""
        return self._blocking_requests.pop(0) if self._blocking_requests else None

    def run_blocking(self, request: BlockingRequest) -> bool:
        """Run a requested blocking snapshot (the pipeline has paused streaming); False when stopped."""
        log.info("signal %s: blocking snapshot of %s; streaming pauses", request.signal_id, ", ".join(request.namespaces))
        return run_blocking_snapshot(
            self.client, self.cfg, self.receiver, self.metrics, request.namespaces, request.filters,
            notifier=self.notifier, stop=self.stop_event,
        )
