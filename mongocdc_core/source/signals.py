"""Signals: Debezium's ad hoc commands (execute-snapshot, stop/pause/resume-snapshot, log).

Three channels deliver them (``signal.enabled.channels``): the source channel (documents inserted
into ``signal.data.collection``, read from the change stream), the Kafka channel
(``signals_kafka.py``) and the file channel (``signal.file``, one JSON signal per line). Every
channel produces the same :class:`Signal`; the :class:`SignalProcessor` queues them (thread-safe)
and acts on them on the dispatcher's thread, so a signal is ordered with the stream around it.

A malformed or unknown signal is logged, reported as a notification and skipped: a bad signal
never stops or stalls the stream.
"""

from __future__ import annotations

import logging
import os
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import orjson
from bson import Timestamp, json_util
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.notifications import log_notification
from mongocdc_core.positions import Position, token_timestamp
from mongocdc_core.quoting import QUOTE_LIMIT, TEXT_LIMIT, bounded, quote
from mongocdc_core.source.errors import CdcError, HistoryLostError

log = logging.getLogger("mongocdc.signals")

CHANNEL_SOURCE = "source"
CHANNEL_KAFKA = "kafka"
CHANNEL_FILE = "file"

#: Signal types written by incremental snapshots themselves (never user commands).
WATERMARK_OPEN = "snapshot-window-open"
WATERMARK_CLOSE = "snapshot-window-close"
WATERMARK_TYPES = frozenset({WATERMARK_OPEN, WATERMARK_CLOSE})

SNAPSHOT_INCREMENTAL = "incremental"
SNAPSHOT_BLOCKING = "blocking"

AGGREGATE_SIGNAL = "Signal"

#: The longest reason a rejection notification or log line carries (``mongocdc_core.quoting``).
REASON_LIMIT = TEXT_LIMIT
#: Longest ``data-collections`` entry (a namespace is at most 255 bytes): compiling a pattern of
#: megabytes would hold the stream for minutes.
MAX_PATTERN_LENGTH = 1024
#: Longest filter in the simple ``field='value' AND ...`` form; larger filters are query documents.
MAX_SIMPLE_FILTER_LENGTH = 64 * 1024


def _bounded(reason: str) -> str:
    return bounded(reason, REASON_LIMIT)


class SignalError(ValueError):
    """A signal that cannot be acted on; the message says which field is wrong and why."""


@dataclass(frozen=True)
class Signal:
    """One signal, whatever channel it came from. ``id`` only labels logs and notifications."""

    id: str
    type: str
    data: dict[str, Any]
    channel: str


# -- parsing ---------------------------------------------------------------------------------------------


def _data(value: Any, signal_id: str) -> dict[str, Any]:
    """The ``data`` field: a document, a JSON string holding one, or absent (empty)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json_util.loads(value)
        except ValueError as exc:
            raise SignalError(f"signal {signal_id}: 'data' is not valid JSON: {exc}") from exc
    if not isinstance(value, Mapping):
        raise SignalError(f"signal {signal_id}: 'data' must be a JSON object, got {type(value).__name__}")
    return dict(value)


def _signal_type(value: Any, signal_id: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise SignalError(f"signal {signal_id}: 'type' must be a non-empty string, got {quote(value)}")
    return value.strip()


def _id_text(value: Any) -> str:
    """A signal id as text (an ObjectId ``_id`` becomes its hex string), cut to a quotable length."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= QUOTE_LIMIT else text[:QUOTE_LIMIT] + "..."


def parse_signal_document(document: Mapping[str, Any], channel: str = CHANNEL_SOURCE) -> Signal:
    """A signal from a signaling-collection document: ``{_id|id, type, data}``.

    The seed inserts documents with or without ``_id``; when ``id`` is absent the ``_id`` MongoDB
    assigned identifies the signal.
    """
    raw_id = document.get("id", document.get("_id"))
    signal_id = _id_text(raw_id) if raw_id is not None else f"{channel}-{uuid.uuid4()}"
    return Signal(signal_id, _signal_type(document.get("type"), signal_id),
                  _data(document.get("data"), signal_id), channel)


def parse_signal_json(
    value: bytes | str,
    channel: str,
    *,
    key: bytes | str | None = None,
    topic_prefix: str | None = None,
    id: str | None = None,  # noqa: A002 - Debezium's field name
) -> Signal:
    """A signal from JSON text (file lines, Kafka message values).

    For Kafka the message key must equal ``topic.prefix`` (pass both to check it); ``id`` is the
    fallback identifier when the JSON has none (e.g. ``kafka-<partition>-<offset>``).
    """
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
    label = id or f"{channel}-signal"
    if key is not None and topic_prefix is not None:
        key_text = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else key
        if key_text != topic_prefix:
            raise SignalError(
                f"signal {label}: message key {quote(key_text)} does not match topic.prefix {topic_prefix!r}"
            )
    try:
        parsed = json_util.loads(text)
    except ValueError as exc:
        raise SignalError(f"signal {label} on the {channel} channel is not valid JSON: {exc}: {quote(text)}") from exc
    if not isinstance(parsed, Mapping):
        raise SignalError(f"signal {label} on the {channel} channel must be a JSON object, got {quote(text)}")
    if id is not None and "id" not in parsed and "_id" not in parsed:
        parsed = {**parsed, "id": id}
    return parse_signal_document(parsed, channel)


# -- collection names and filters ------------------------------------------------------------------------

_QUOTED_PART = re.compile(r'"((?:[^"]|"")*)"')


def _quoted_parts(entry: str, text: str) -> list[str]:
    """The parts of ``"db"."My.Collection"``, unquoted."""
    parts: list[str] = []
    rest = text
    while rest:
        match = _QUOTED_PART.match(rest)
        if match is None:
            raise SignalError(
                f"data-collections entry {quote(entry)}: quote every part, as in \"db\".\"My.Collection\""
            )
        parts.append(match.group(1).replace('""', '"'))
        rest = rest[match.end():]
        if rest.startswith("."):
            rest = rest[1:]
            if not rest:
                raise SignalError(f"data-collections entry {quote(entry)} ends with a dot")
        elif rest:
            raise SignalError(f"data-collections entry {quote(entry)}: expected '.' between quoted parts")
    return parts


_PLAIN_NAMESPACE = re.compile(r"[\w$-]+(?:\\?\.[\w$-]+)+")


def literal_namespace(entry: str) -> str | None:
    """The one ``db.collection`` an entry names when it is a plain or quoted name, None for a pattern."""
    text = entry.strip()
    if text.startswith('"'):
        return ".".join(_quoted_parts(entry, text))
    return text.replace("\\.", ".") if _PLAIN_NAMESPACE.fullmatch(text) else None


def collection_pattern(entry: str) -> re.Pattern[str]:
    """The regular expression for one ``data-collections`` entry (anchored, case-insensitive).

    Entries are regular expressions over ``<db>.<collection>``; a name whose parts contain dots is
    written with each part in double quotes (``"public"."My.Collection"``) and then matched
    literally, part by part.
    """
    text = entry.strip()
    if not text:
        raise SignalError("data-collections entries must be non-empty strings")
    if len(text) > MAX_PATTERN_LENGTH:
        raise SignalError(f"data-collections entry {quote(text)} is longer than {MAX_PATTERN_LENGTH} characters")
    if text.startswith('"'):
        parts = _quoted_parts(entry, text)
        text = r"\.".join(re.escape(p) for p in parts)
    try:
        return re.compile(f"(?:{text})", re.IGNORECASE)
    except re.error as exc:
        raise SignalError(f"data-collections entry {quote(entry)} is not a valid regular expression: {exc}") from exc


def match_collections(entries: Sequence[str], candidates: Iterable[str]) -> list[str]:
    """The candidates (``db.coll``) matched by any entry, in candidate order, without repeats."""
    patterns = [collection_pattern(e) for e in entries]
    return [ns for ns in candidates if any(p.fullmatch(ns) for p in patterns)]


_TERM = re.compile(
    r"""^\s*(?P<field>[A-Za-z_$][\w.$-]*|"[^"]+"|`[^`]+`)\s*(?P<op>=|!=|<>|>=|<=|>|<)\s*(?P<value>.+?)\s*$""",
    re.DOTALL,
)
_AND = re.compile(r"\s+AND\s+", re.IGNORECASE)
_OPS = {"!=": "$ne", "<>": "$ne", ">": "$gt", ">=": "$gte", "<": "$lt", "<=": "$lte"}
_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _split_and(text: str) -> list[str]:
    """Split on ``AND`` outside quoted strings."""
    parts: list[str] = []
    start = 0
    mark: str | None = None
    i = 0
    while i < len(text):
        ch = text[i]
        if mark:
            if ch == mark:
                mark = None
        elif ch in "'\"":
            mark = ch
        else:
            match = _AND.match(text, i)
            if match and text[i].isspace():
                parts.append(text[start:i])
                start = i = match.end()
                continue
        i += 1
    if mark:
        raise SignalError(f"filter {quote(text)} has an unterminated {mark} quote")
    parts.append(text[start:])
    return parts


def _literal(text: str, whole: str) -> Any:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        mark, inner = text[0], text[1:-1]
        if mark in inner.replace(mark * 2, ""):
            raise SignalError(
                f"filter {quote(whole)}: cannot translate {quote(text)}; use field='value' terms joined by AND "
                "(no OR, parentheses or functions) or a MongoDB query document"
            )
        return inner.replace(mark * 2, mark)
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "null":
        return None
    if _NUMBER.match(text):
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)
    raise SignalError(
        f"filter {quote(whole)}: cannot translate, {quote(text)} is not a value ('text', a number, true, false or "
        "null); use field='value' terms joined by AND (no OR, parentheses or functions) or a MongoDB query document"
    )


def parse_filter(value: Any) -> dict[str, Any]:
    """An ``additional-conditions`` filter as a MongoDB query document.

    Accepted: a query document (or its JSON / extended JSON text), or the simple form of the seed,
    ``field='value' AND other=5`` (comparisons ``= != <> > >= < <=`` joined by AND). Anything else
    (SQL statements, OR, parentheses, functions) is rejected with a message saying so.
    """
    if isinstance(value, Mapping):
        return dict(value)
    if not isinstance(value, str) or not value.strip():
        raise SignalError(f"filter must be a query document or a non-empty string, got {quote(value)}")
    text = value.strip()
    if text.startswith("{"):
        try:
            parsed = json_util.loads(text)
        except ValueError as exc:
            raise SignalError(f"filter {quote(text)} is not a valid JSON query document: {exc}") from exc
        if not isinstance(parsed, dict):
            raise SignalError(f"filter {quote(text)} must be a JSON object")
        return parsed
    if len(text) > MAX_SIMPLE_FILTER_LENGTH:
        raise SignalError(f"filter {quote(text)} is longer than {MAX_SIMPLE_FILTER_LENGTH} characters; write a "
                          "filter this large as a MongoDB query document")
    if re.match(r"(?i)^\s*select\b", text):
        raise SignalError(
            f"filter {quote(text)} is a SQL statement; MongoDB needs a query document such as "
            "{\"color\": \"blue\"} or the simple form color='blue' AND brand='MyBrand'"
        )
    terms: list[dict[str, Any]] = []
    for part in _split_and(text):
        match = _TERM.match(part)
        if match is None:
            raise SignalError(
                f"filter {quote(text)}: cannot translate {quote(part.strip())}; use field='value' terms joined by AND "
                "(no OR, parentheses or functions) or a MongoDB query document"
            )
        name = match.group("field").strip('"`')
        literal = _literal(match.group("value").strip(), text)
        op = match.group("op")
        terms.append({name: literal} if op == "=" else {name: {_OPS[op]: literal}})
    return terms[0] if len(terms) == 1 else {"$and": terms}


# -- requests --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SnapshotRequest:
    """A validated ``execute-snapshot``: collection entries, type, and filters by collection entry."""

    signal_id: str
    snapshot_type: str
    collections: tuple[str, ...]
    conditions: tuple[tuple[str, dict[str, Any]], ...] = ()

    def resolve(self, candidates: Iterable[str]) -> tuple[list[str], dict[str, dict[str, Any]]]:
        """Matching collections (candidate order) and each one's filter (from ``additional-conditions``)."""
        namespaces = match_collections(self.collections, candidates)
        filters: dict[str, dict[str, Any]] = {}
        for entry, query in self.conditions:
            pattern = collection_pattern(entry)
            for ns in namespaces:
                if pattern.fullmatch(ns):
                    filters[ns] = query
        return namespaces, filters


def _entries(value: Any, signal_id: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SignalError(f"signal {signal_id}: '{what}' must be an array of strings, got {quote(value)}")
    for entry in value:
        collection_pattern(entry)
    return tuple(value)


@contextmanager
def _labelled(signal_id: str) -> Iterator[None]:
    """Every problem found in a signal's data names the signal."""
    try:
        yield
    except SignalError as exc:
        if str(exc).startswith(f"signal {signal_id}"):
            raise
        raise SignalError(f"signal {signal_id}: {exc}") from exc


def parse_execute_snapshot(signal: Signal) -> SnapshotRequest:
    """Validate an ``execute-snapshot`` signal's data (type, data-collections, additional-conditions)."""
    with _labelled(signal.id):
        return _parse_execute_snapshot(signal)


def _parse_execute_snapshot(signal: Signal) -> SnapshotRequest:
    data = signal.data
    kind = data.get("type", SNAPSHOT_INCREMENTAL)
    if not isinstance(kind, str) or kind.lower() not in (SNAPSHOT_INCREMENTAL, SNAPSHOT_BLOCKING):
        raise SignalError(f"signal {signal.id}: snapshot type must be 'incremental' or 'blocking', got {quote(kind)}")
    if "data-collections" not in data:
        raise SignalError(f"signal {signal.id}: execute-snapshot requires 'data-collections'")
    collections = _entries(data["data-collections"], signal.id, "data-collections")
    if not collections:
        raise SignalError(f"signal {signal.id}: 'data-collections' is empty, so there is nothing to snapshot; "
                          "list the collections (<db>.<collection> or regular expressions)")
    conditions: list[tuple[str, dict[str, Any]]] = []
    legacy = data.get("additional-condition")
    if legacy not in (None, ""):
        conditions.extend((entry, parse_filter(legacy)) for entry in collections)
    raw = data.get("additional-conditions") or []
    if not isinstance(raw, list):
        raise SignalError(f"signal {signal.id}: 'additional-conditions' must be an array, got {quote(raw)}")
    for item in raw:
        if not isinstance(item, Mapping) or not isinstance(item.get("data-collection"), str):
            raise SignalError(
                f"signal {signal.id}: each additional condition needs a 'data-collection' string and a "
                f"'filter', got {quote(item)}"
            )
        if "filter" not in item:
            raise SignalError(f"signal {signal.id}: additional condition for {quote(item['data-collection'])} has no 'filter'")
        if not _names_a_signal_collection(item["data-collection"], collections):
            raise SignalError(
                f"signal {signal.id}: additional condition for {quote(item['data-collection'])} names a collection "
                f"that is not in data-collections {quote(list(collections))}"
            )
        try:
            query = parse_filter(item["filter"])
        except SignalError as exc:
            raise SignalError(f"signal {signal.id}: additional condition for {quote(item['data-collection'])}: {exc}") from exc
        conditions.append((item["data-collection"], query))
    return SnapshotRequest(signal.id, kind.lower(), collections, tuple(conditions))


def _names_a_signal_collection(entry: str, collections: Sequence[str]) -> bool:
    """Whether an ``additional-conditions`` entry is one of the signal's ``data-collections``: the same
    entry (case aside), or a collection name that one of them matches."""
    collection_pattern(entry)
    if any(entry.strip().lower() == c.strip().lower() for c in collections):
        return True
    name = literal_namespace(entry)
    return name is not None and any(collection_pattern(c).fullmatch(name) for c in collections)


@dataclass(frozen=True)
class StopRequest:
    """A validated ``stop-snapshot``: ``collections`` None stops the whole snapshot of that type."""

    signal_id: str
    collections: tuple[str, ...] | None
    snapshot_type: str = SNAPSHOT_INCREMENTAL


def parse_stop_snapshot(signal: Signal) -> StopRequest:
    """Validate a ``stop-snapshot``: the seed requires ``data.type``; the engine stops incremental
    snapshots, where blocking snapshots run as separate jobs (Dagster) those can be stopped too."""
    with _labelled(signal.id):
        return _parse_stop_snapshot(signal)


def _parse_stop_snapshot(signal: Signal) -> StopRequest:
    kind = signal.data.get("type")
    if not isinstance(kind, str) or kind.lower() not in (SNAPSHOT_INCREMENTAL, SNAPSHOT_BLOCKING):
        raise SignalError(
            f"signal {signal.id}: stop-snapshot requires data.type 'incremental' (or 'blocking' for snapshots "
            f"run as separate jobs), got {quote(kind)}"
        )
    raw = signal.data.get("data-collections")
    if raw is None or raw == []:
        return StopRequest(signal.id, None, kind.lower())
    return StopRequest(signal.id, _entries(raw, signal.id, "data-collections"), kind.lower())


# -- notifications ---------------------------------------------------------------------------------------


class Notifier(Protocol):
    """Where notifications go (``mongocdc_core/notifications.py`` implements log and sink channels)."""

    def notify(self, aggregate_type: str, type: str, additional_data: Mapping[str, str]) -> None:  # noqa: A002
        """Report one notification; must not raise."""


@dataclass
class LogNotifier:
    """Debezium's log notification channel: one INFO line per notification; keeps them for inspection."""

    connector_name: str = ""
    sent: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def notify(self, aggregate_type: str, type: str, additional_data: Mapping[str, str]) -> None:  # noqa: A002
        notification = {
            "id": str(uuid.uuid4()),
            "aggregate_type": aggregate_type,
            "type": type,
            "additional_data": {k: str(v) for k, v in additional_data.items()},
            "timestamp": int(time.time() * 1000),
        }
        with self.lock:
            self.sent.append(notification)
        log_notification(self.connector_name, notification)


# -- processing ------------------------------------------------------------------------------------------


class SnapshotControl(Protocol):
    """What the processor drives: the incremental snapshotter (``incremental.IncrementalSnapshotter``)."""

    def start(self, signal_id: str, namespaces: Sequence[str], filters: Mapping[str, dict[str, Any]]) -> None: ...

    def stop(self, namespaces: Sequence[str] | None) -> list[str]: ...

    def pause(self) -> bool: ...

    def resume(self) -> bool: ...

    def collections(self) -> list[str]: ...


BlockingRunner = Callable[[str, list[str], dict[str, dict[str, Any]]], None]


class SignalProcessor:
    """Queues signals from any thread and executes them on the dispatcher's thread (``process``).

    ``candidates`` lists the captured collections that ``data-collections`` may match;
    ``run_blocking`` runs a blocking snapshot synchronously (streaming waits meanwhile).
    """

    def __init__(
        self,
        snapshots: SnapshotControl,
        notifier: Notifier,
        candidates: Callable[[], list[str]],
        run_blocking: BlockingRunner | None = None,
        *,
        connector_name: str = "",
    ) -> None:
        self.snapshots = snapshots
        self.notifier = notifier
        self.candidates = candidates
        self.run_blocking = run_blocking
        self.connector_name = connector_name
        self._queue: queue.SimpleQueue[Signal] = queue.SimpleQueue()
        self.processed = 0
        self.rejected = 0

    # -- intake (any thread) ---------------------------------------------------------------------------

    def submit(self, signal: Signal) -> None:
        """Queue a parsed signal (thread-safe, never raises)."""
        self._queue.put(signal)

    def reject(self, channel: str, reason: str, signal_id: str = "") -> None:
        """Report a signal that could not be parsed (thread-safe, never raises)."""
        self.rejected += 1
        reason = _bounded(reason)
        log.warning("skipping signal %s from the %s channel: %s", signal_id or "?", channel, reason)
        self._notify(AGGREGATE_SIGNAL, "REJECTED", {"signal_id": signal_id, "channel": channel, "reason": reason})

    def receive_json(self, value: bytes | str, channel: str, **kwargs: Any) -> None:
        """Parse JSON text from a channel and queue it, or reject it."""
        try:
            self.submit(parse_signal_json(value, channel, **kwargs))
        except SignalError as exc:
            self.reject(channel, str(exc), kwargs.get("id") or "")

    def receive_document(self, document: Mapping[str, Any], channel: str = CHANNEL_SOURCE) -> None:
        """Parse a signaling-collection document and queue it, or reject it."""
        try:
            self.submit(parse_signal_document(document, channel))
        except SignalError as exc:
            raw = document.get("id", document.get("_id"))
            self.reject(channel, str(exc), _id_text(raw) if raw is not None else "")

    # -- execution (dispatcher thread) -----------------------------------------------------------------

    def pending(self) -> bool:
        return not self._queue.empty()

    def process(self) -> int:
        """Execute every queued signal in arrival order; returns how many were handled."""
        handled = 0
        while True:
            try:
                signal = self._queue.get_nowait()
            except queue.Empty:
                return handled
            handled += 1
            self.execute(signal)

    def execute(self, signal: Signal) -> None:
        """Act on one signal; any problem is logged and notified, never raised."""
        try:
            self._execute(signal)
            self.processed += 1
        except SignalError as exc:
            self.reject(signal.channel, str(exc), signal.id)
        except Exception as exc:  # a failing action must not stop the stream
            log.exception("signal %s (%s) failed", signal.id, signal.type)
            self.reject(signal.channel, f"{signal.type} failed: {type(exc).__name__}: {exc}", signal.id)

    def _execute(self, signal: Signal) -> None:
        kind = signal.type.lower()
        log.info("signal %s from the %s channel: %s %s", signal.id, signal.channel, quote(signal.type),
                 quote(orjson.dumps(signal.data, default=str).decode()))
        if kind == "execute-snapshot":
            self._execute_snapshot(parse_execute_snapshot(signal))
        elif kind == "stop-snapshot":
            request = parse_stop_snapshot(signal)
            if request.snapshot_type != SNAPSHOT_INCREMENTAL:
                raise SignalError(f"signal {signal.id}: a blocking snapshot cannot be stopped, it holds the stream "
                                  "until it completes; only incremental snapshots can be stopped")
            stopped = self.snapshots.stop(
                None if request.collections is None else match_collections(request.collections, self.snapshots.collections())
            )
            log.info("signal %s stopped the incremental snapshot of %s", signal.id, ", ".join(stopped) or "nothing")
        elif kind == "pause-snapshot":
            if not self.snapshots.pause():
                raise SignalError(f"signal {signal.id}: no incremental snapshot is running, nothing to pause")
        elif kind == "resume-snapshot":
            if not self.snapshots.resume():
                raise SignalError(f"signal {signal.id}: no paused incremental snapshot, nothing to resume")
        elif kind == "log":
            message = signal.data.get("message")
            if not isinstance(message, str):
                raise SignalError(f"signal {signal.id}: log requires data.message as a string")
            log.info("log signal %s: %s", signal.id, message if len(message) <= REASON_LIMIT else quote(message, REASON_LIMIT))
        elif kind in WATERMARK_TYPES:
            return  # another run's window marker: not a command
        else:
            raise SignalError(
                f"signal {signal.id}: unknown signal type {quote(signal.type)} (known: execute-snapshot, stop-snapshot, "
                "pause-snapshot, resume-snapshot, log)"
            )

    def _execute_snapshot(self, request: SnapshotRequest) -> None:
        namespaces, filters = request.resolve(self.candidates())
        if not namespaces:
            raise SignalError(
                f"signal {request.signal_id}: data-collections {list(request.collections)} match no captured collection"
            )
        if request.snapshot_type == SNAPSHOT_BLOCKING:
            if self.run_blocking is None:
                raise SignalError(f"signal {request.signal_id}: blocking snapshots are not available here")
            self.run_blocking(request.signal_id, namespaces, filters)
        else:
            self.snapshots.start(request.signal_id, namespaces, filters)

    def _notify(self, aggregate_type: str, type: str, data: Mapping[str, str]) -> None:  # noqa: A002
        try:
            self.notifier.notify(aggregate_type, type, {"connector_name": self.connector_name, **data})
        except Exception:  # notification channels must not break signal handling
            log.exception("notification %s %s failed", aggregate_type, type)


# -- file channel ----------------------------------------------------------------------------------------


class FileSignalChannel(threading.Thread):
    """Debezium's file channel: every ``signal.poll.interval.ms`` the file's lines are read as signals.

    The file is moved aside before reading (so each line is processed once, and lines appended
    meanwhile land in a new file), then deleted. Blank lines are ignored.
    """

    def __init__(self, path: str | os.PathLike[str], interval_s: float, processor: SignalProcessor) -> None:
        super().__init__(name="mongocdc-signal-file", daemon=True)
        self.path = Path(path)
        self.interval_s = interval_s
        self.processor = processor
        self._halt = threading.Event()
        self._incomplete: tuple[int, int] | None = None

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        while True:
            try:
                self.poll()
            except OSError as exc:
                log.warning("file signal channel cannot read %s: %s", self.path, exc)
            if self._halt.wait(self.interval_s):
                return

    def poll(self) -> int:
        """Read and hand over the file's signals now; returns how many lines were read.

        A file whose last line is incomplete (a writer is still at it) is left until a later poll
        finds it unchanged. Writers should append whole lines, or write a temporary file and
        rename it into place.
        """
        try:
            stat = self.path.stat()
            with self.path.open("rb") as fh:
                if stat.st_size == 0:
                    return 0
                fh.seek(-1, os.SEEK_END)
                complete = fh.read(1) == b"\n"
        except FileNotFoundError:
            return 0
        seen = (stat.st_size, stat.st_mtime_ns)
        if not complete and seen != self._incomplete:
            self._incomplete = seen
            return 0
        self._incomplete = None
        taken = self.path.with_name(f".{self.path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.reading")
        try:
            os.replace(self.path, taken)
        except FileNotFoundError:
            return 0
        try:
            lines = taken.read_bytes().splitlines()
        finally:
            taken.unlink(missing_ok=True)
        count = 0
        for number, line in enumerate(lines, 1):
            if line.strip():
                count += 1
                self.processor.receive_json(line, CHANNEL_FILE, id=f"file-{self.path.name}-{number}")
        return count


# -- the source channel, read by position (for orchestrators) ----------------------------------------------


@dataclass(frozen=True)
class SignalInsert:
    """A document inserted into the signaling collection, with the position of its insert."""

    document: dict[str, Any]
    position: Position
    token: dict[str, Any]


@dataclass(frozen=True)
class SignalRead:
    """Signals read from one position on; ``resume_token`` is where the next read continues.

    ``complete`` says the read reached ``until`` (every signal inserted before it is in ``inserts``).
    """

    inserts: list[SignalInsert]
    resume_token: dict[str, Any] | None
    complete: bool
    until: Timestamp


def read_signal_inserts(
    client: MongoClient[Any],
    cfg: ConnectorConfig,
    *,
    resume_after: Mapping[str, Any] | None,
    start_at: Timestamp | None,
    until: Timestamp,
    limit: int,
    wait_s: float = 5.0,
) -> SignalRead:
    """The signals inserted after ``resume_after`` (or from ``start_at``) up to ``until``, in insert order.

    The signaling collection is followed by its change stream, so signals are found by the position
    of their insert, whatever type their ``_id`` has; incremental-snapshot watermarks are left out.
    Stops after ``limit`` signals, at ``until``, or after ``wait_s`` without reaching it. A resume
    token that left the oplog raises ``HistoryLostError`` (signals in between were purged).
    """
    if not cfg.signal_data_collection:
        raise CdcError("signal.data.collection is not set")
    db, _, coll = cfg.signal_data_collection.partition(".")
    options: dict[str, Any] = {"start_after": dict(resume_after)} if resume_after else {"start_at_operation_time": start_at}
    match = {"$match": {"operationType": "insert", "fullDocument.type": {"$nin": sorted(WATERMARK_TYPES)}}}
    inserts: list[SignalInsert] = []
    deadline = time.monotonic() + wait_s
    complete = False
    try:
        with client[db][coll].watch([match], max_await_time_ms=200, **options) as stream:
            while len(inserts) < limit:
                change = stream.try_next()
                if change is not None:
                    inserts.append(SignalInsert(dict(change["fullDocument"]),
                                                Position.from_timestamp(change["clusterTime"]), dict(change["_id"])))
                    continue
                reached = token_timestamp(dict(stream.resume_token) if stream.resume_token else None)
                if reached is not None and (reached.time, reached.inc) >= (until.time, until.inc):
                    complete = True
                    break
                if time.monotonic() > deadline:
                    break
            token = stream.resume_token
    except OperationFailure as exc:
        if exc.code in (136, 286) or "ChangeStreamHistoryLost" in str(exc):
            raise HistoryLostError(
                f"the signaling collection's position {token_timestamp(dict(resume_after)) if resume_after else start_at} "
                f"left the oplog before its signals were read: {exc}",
                position=token_timestamp(dict(resume_after)) if resume_after else start_at,
            ) from exc
        raise
    return SignalRead(inserts, dict(token) if token else None, complete, until)
