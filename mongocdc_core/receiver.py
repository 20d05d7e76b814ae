"""What sources hand their output to: the interface between ``source/`` and the capture pipeline.

Control flows one way: a source (snapshot copier, incremental or blocking snapshot) produces
chunks of documents and gives them to a :class:`SnapshotReceiver`; it never knows the dispatcher
that implements it. The dispatcher, in turn, never imports a source: the types both sides share
live here.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bson import Timestamp

from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position


@dataclass(slots=True)
class SnapshotChunk:
    """Documents of one collection in delivery order, with their markers; ``final`` ends the collection.

    ``part`` is the ``_id`` range the documents come from, ``part_done`` says that range is complete,
    and ``after`` is the last key of the chunk (canonical Extended JSON): once the chunk is flushed,
    a restart resumes the range after it. ``documents`` may be a raw batch
    (:class:`~mongocdc_core.events.raw.RawDocuments`), decoded only where needed. ``records`` are
    the chunk's records when they were converted ahead of its turn (a copier's ``prepare``, run by
    each range's worker in parallel); None (not prepared, or its preparation failed): the
    receiver converts the documents itself. ``asked``: :attr:`~mongocdc_core.metrics.ConnectorMetrics.losses`
    when its documents were asked for (they may be handed over long after, as an incremental
    snapshot's chunk when the stream closes its window, or a snapshot copier's batch read ahead while the
    previous one was delivered); None: read just before they are handed over.
    """

    namespace: str
    documents: Sequence[dict[str, Any]]
    markers: list[str]
    final: bool
    part: int = 0
    part_done: bool = False
    after: str | None = None
    records: Sequence[Record] | None = None
    asked: int | None = None


@dataclass(frozen=True)
class StartPoint:
    """Where a snapshot stands in the stream: streaming resumes after ``token``."""

    token: dict[str, Any] | None
    position: Position
    cluster_time: Timestamp


class SnapshotReceiver(Protocol):
    """Where snapshot sources deliver reads and progress (implemented by the dispatcher)."""

    def snapshot_chunk(self, chunk: SnapshotChunk, position: Position, read_at: datetime.datetime) -> None:
        """Convert and write the chunk's reads at ``position``."""

    def set_incremental(self, state: dict[str, Any] | None) -> None:
        """Record incremental snapshot progress; durable with the next commit (after the sink flush)."""

    def commit(self) -> None:
        """Flush what was written, then save the offset."""

    def begin_full_copies(self, namespaces: Sequence[str]) -> None:
        """These collections are about to be copied whole: a copy's last chunk may then delete the keys
        downstream holds that it did not read (``mongocdc.snapshot.delete.missing.keys``)."""


def duration(seconds: float) -> str:
    """A duration as progress lines spell it: ``42 s``, ``3 min 05 s``, ``2 h 10 min``."""
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    if seconds >= 60:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds} s"


class ProgressListener:
    """Hooks for rendering progress (the CLI draws them with rich); override what you need.

    Called from the engine's threads; implementations must be quick and must not raise.
    """

    def snapshot_started(self, totals: Mapping[str, int | None]) -> None:
        """A snapshot of these collections (estimated document counts) begins."""

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        """``copied`` documents of ``namespace`` were delivered so far."""

    def snapshot_collection_done(self, namespace: str, copied: int) -> None:
        """``namespace`` was copied completely and its records flushed."""

    def snapshot_finished(self, completed: bool, documents: int) -> None:
        """The snapshot ended (``completed`` False when it was stopped)."""

    def streaming_started(self, position: Position | None) -> None:
        """Streaming begins after ``position`` (None: from now)."""

    def streaming_progress(self, events: int, counts: Mapping[str, int], position: Position | None) -> None:
        """``events`` change events were dispatched so far (``counts`` by op)."""

    def connecting(self, state: ConnectionState) -> None:
        """MongoDB did not answer: which host, the last error, reconnection attempt k of n and when."""


@dataclass(frozen=True)
class ConnectionState:
    """One failed connection attempt, for the connection-state line the CLI shows.

    ``attempt`` counts the reconnection attempts (``connect.max.attempts`` of them), the next of
    which starts in ``next_try_s`` seconds.
    """

    hosts: str
    attempt: int
    max_attempts: int
    next_try_s: float
    error: str

    def line(self) -> str:
        """``connecting to HOST failed (ERROR); reconnection attempt k of n in s s``."""
        return (
            f"connecting to {self.hosts} failed ({self.error}); reconnection attempt {self.attempt} of "
            f"{self.max_attempts} in {self.next_try_s:g} s"
        )
