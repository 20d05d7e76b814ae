"""Change streams of the emulated replica set, as mongod 7.0 produces them for the drivers.

``open_change_stream`` parses the ``$changeStream`` stage and returns a ``ChangeStreamCursor``
that reads the shared oplog and turns entries into change events: the same fields, field order,
resume tokens (``resume_token``), ``updateDescription`` (``oplog_diff``), invalidation rules,
resume checks and error codes/labels as mongod. The server registers the cursor as a
tailable-await cursor and calls ``next_batch`` for the aggregate's first batch and every getMore.

Events are returned already encoded as BSON so the server splices them into its reply without
encoding them a second time; the size checks (16 MiB batches, oversized events,
``$changeStreamSplitLargeEvent``) need the encoded size anyway. Streams without user stages
encode CRUD events straight from cached BSON fragments (``_raw_crud_event``), which is what
makes draining a large oplog cheap; streams with stages build documents for ``run_pipeline``.
"""

from __future__ import annotations

import datetime
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import bson
from bson import Int64, Timestamp
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion

from mongocdc_devstack import resume_token as rt
from mongocdc_devstack.errors import (
    BAD_VALUE,
    BSON_OBJECT_TOO_LARGE,
    CHANGE_STREAM_FATAL_ERROR,
    CHANGE_STREAM_HISTORY_LOST,
    FAILED_TO_PARSE,
    ILLEGAL_OPERATION,
    INVALID_NAMESPACE,
    INVALID_OPTIONS,
    INVALID_RESUME_TOKEN,
    TYPE_MISMATCH,
    CommandError,
    command_error,
)
from mongocdc_devstack.matching import bson_type_name, compile_filter
from mongocdc_devstack.oplog import Oplog, ts_key
from mongocdc_devstack.oplog_diff import update_description

CODEC_OPTIONS: CodecOptions[Any] = CodecOptions(
    uuid_representation=UuidRepresentation.STANDARD, tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)

BSON_OBJ_MAX_USER_SIZE = 16 * 1024 * 1024
BSON_OBJ_MAX_INTERNAL_SIZE = BSON_OBJ_MAX_USER_SIZE + 16 * 1024
MAX_CHANGE_EVENT_SIZE = BSON_OBJ_MAX_INTERNAL_SIZE - 8 * 1024  # $changeStreamSplitLargeEvent threshold
DEFAULT_AWAIT_MS = 1000  # mongod's await time for a getMore without maxTimeMS
NO_MATCHING_DOCUMENT = (47, "NoMatchingDocument")
CAPPED_POSITION_LOST = (136, "CappedPositionLost")
NON_RESUMABLE = ("NonResumableChangeStreamError",)
INTERNAL_DATABASES = frozenset({"admin", "config", "local"})

# Codes mongod labels ResumableChangeStreamError on a change stream aggregate/getMore: the
# RetriableError, NetworkError and NeedRetargettingError categories, RetryChangeStream and
# FailedToSatisfyReadPreference (src/mongo/db/error_labels.cpp).
RESUMABLE_CODES = frozenset(
    {6, 7, 63, 89, 91, 133, 134, 150, 189, 202, 234, 262, 317, 384, 402, 9001, 10107, 11600, 11602,
     13388, 13435, 13436}
)
NON_RESUMABLE_CODES = frozenset({280, 286})

_SPEC_FIELDS = frozenset(
    {"resumeAfter", "startAfter", "startAtOperationTime", "fullDocument", "fullDocumentBeforeChange",
     "allChangesForCluster", "showExpandedEvents", "showMigrationEvents", "showSystemEvents",
     "showRawUpdateDescription", "allowToRunOnConfigDB", "allowToRunOnSystemNS"}
)
_FULL_DOCUMENT_MODES = ("default", "updateLookup", "whenAvailable", "required")
_BEFORE_CHANGE_MODES = ("off", "whenAvailable", "required")
_ALLOWED_USER_STAGES = frozenset(
    {"$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith", "$redact"}
)
_SPLIT_STAGE = "$changeStreamSplitLargeEvent"


def change_stream_error_labels(code: int) -> tuple[str, ...]:
    """The ``errorLabels`` mongod attaches to an error of a change stream aggregate or getMore."""
    if code in RESUMABLE_CODES:
        return ("ResumableChangeStreamError",)
    if code in NON_RESUMABLE_CODES:
        return NON_RESUMABLE
    return ()


class ChangeStreamHost(Protocol):
    """What a change stream needs from the server state (implemented by ``ServerState``)."""

    oplog: Oplog

    def collection_uuid(self, db: str, coll: str) -> uuid.UUID | None: ...

    def collection_options(self, db: str, coll: str) -> dict[str, Any]: ...

    def lookup_document(self, db: str, coll: str, document_key: dict[str, Any]) -> dict[str, Any] | None: ...

    def lookup_document_bson(self, db: str, coll: str, document_key: dict[str, Any]) -> bytes | None: ...

    def change_stream_images(
        self, ui: uuid.UUID, ts: Timestamp, index: int
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None] | None: ...

    def change_stream_images_bson(self, ui: uuid.UUID, ts: Timestamp, index: int) -> tuple[bytes | None, bytes | None] | None: ...

    def run_pipeline(self, docs: list[dict[str, Any]], stages: list[dict[str, Any]]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class StreamSpec:
    """The parsed ``$changeStream`` stage."""

    full_document: str = "default"
    full_document_before_change: str = "off"
    show_expanded_events: bool = False
    show_migration_events: bool = False
    all_changes_for_cluster: bool = False
    resume: rt.ResumeTokenData | None = None
    resume_token: Mapping[str, Any] | None = None
    start_after: bool = False
    start_at_operation_time: Timestamp | None = None


def _location(code: int, errmsg: str) -> CommandError:
    return CommandError(code, f"Location{code}", errmsg)


def parse_spec(spec: Any) -> StreamSpec:
    """Validate the ``$changeStream`` stage's options like mongod's IDL parser."""
    if not isinstance(spec, Mapping):
        raise command_error(FAILED_TO_PARSE, "the $changeStream stage specification must be an object")
    for key in spec:
        if key not in _SPEC_FIELDS:
            raise _location(40415, f"BSON field '$changeStream.{key}' is an unknown field.")
    full_document = _enum(spec, "fullDocument", _FULL_DOCUMENT_MODES)
    before_change = _enum(spec, "fullDocumentBeforeChange", _BEFORE_CHANGE_MODES)
    flags = {}
    for key in ("showExpandedEvents", "showMigrationEvents", "allChangesForCluster"):
        value = spec.get(key, False)
        if not isinstance(value, bool):
            raise command_error(
                TYPE_MISMATCH,
                f"BSON field '$changeStream.{key}' is the wrong type '{bson_type_name(value)}', expected type 'bool'",
            )
        flags[key] = value
    given = [k for k in ("resumeAfter", "startAfter", "startAtOperationTime") if k in spec]
    if len(given) > 1:
        raise _location(40674, "Only one type of resume option is allowed, but multiple were found.")
    resume = None
    resume_token = None
    start_at = None
    if given and given[0] in ("resumeAfter", "startAfter"):
        resume_token = spec[given[0]]
        if not isinstance(resume_token, Mapping):
            raise command_error(
                TYPE_MISMATCH,
                f"BSON field '$changeStream.{given[0]}' is the wrong type '{bson_type_name(resume_token)}', "
                "expected type 'object'",
            )
        resume = rt.decode(resume_token)
        if resume.from_invalidate and given[0] == "resumeAfter":
            raise command_error(
                INVALID_RESUME_TOKEN,
                "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate "
                "notification.",
            )
    elif given:
        start_at = spec["startAtOperationTime"]
        if not isinstance(start_at, Timestamp):
            raise command_error(
                TYPE_MISMATCH,
                "BSON field '$changeStream.startAtOperationTime' is the wrong type "
                f"'{bson_type_name(start_at)}', expected type 'timestamp'",
            )
    return StreamSpec(
        full_document=full_document,
        full_document_before_change=before_change,
        show_expanded_events=flags["showExpandedEvents"],
        show_migration_events=flags["showMigrationEvents"],
        all_changes_for_cluster=flags["allChangesForCluster"],
        resume=resume,
        resume_token=resume_token,
        start_after=bool(given) and given[0] == "startAfter",
        start_at_operation_time=start_at,
    )


def _enum(spec: Mapping[str, Any], key: str, allowed: Sequence[str]) -> str:
    value = spec.get(key, allowed[0])
    if not isinstance(value, str):
        raise command_error(
            TYPE_MISMATCH,
            f"BSON field '$changeStream.{key}' is the wrong type '{bson_type_name(value)}', expected type 'string'",
        )
    if value not in allowed:
        raise command_error(
            BAD_VALUE, f"Enumeration value '{value}' for field '$changeStream.{key}' is not a valid value."
        )
    return value


def open_change_stream(
    host: ChangeStreamHost, db: str, coll: str | None, pipeline: Sequence[Mapping[str, Any]], cmd: Mapping[str, Any]
) -> ChangeStreamCursor:
    """Open the change stream an ``aggregate`` with a leading ``$changeStream`` stage asks for."""
    if not pipeline or not isinstance(pipeline[0], Mapping) or "$changeStream" not in pipeline[0]:
        raise command_error(BAD_VALUE, "a change stream pipeline must start with $changeStream")
    spec = parse_spec(pipeline[0]["$changeStream"])
    _check_namespace(db, coll, spec)
    concern = cmd.get("readConcern")
    level = concern.get("level") if isinstance(concern, Mapping) else None
    if level is not None and level != "majority":
        # Change streams read majority-committed data; only an implicit default is upgraded to it.
        raise command_error(
            INVALID_OPTIONS,
            f"Aggregation stage $changeStream cannot run with a readConcern other than 'majority'. Current readConcern: {level}",
        )
    stages = [dict(stage) for stage in pipeline[1:]]
    split = False
    for position, stage in enumerate(stages):
        if not isinstance(stage, Mapping) or len(stage) != 1:
            raise _location(40323, "A pipeline stage specification object must contain exactly one field.")
        name, options = next(iter(stage.items()))
        if name == _SPLIT_STAGE:
            if not (isinstance(options, Mapping) and not options):
                raise _location(7182800, "$changeStreamSplitLargeEvent spec should be an empty object")
            if position != len(stages) - 1:
                raise _location(7182802, "$changeStreamSplitLargeEvent must be the last stage in the pipeline")
            split = True
        elif name == "$changeStream":
            raise _location(40602, "$changeStream is only valid as the first stage in a pipeline.")
        elif name not in _ALLOWED_USER_STAGES:
            raise command_error(ILLEGAL_OPERATION, f"{name} is not permitted in a $changeStream pipeline")
    if split:
        stages.pop()
    return ChangeStreamCursor(host, db, coll, spec, stages, split)


def _check_namespace(db: str, coll: str | None, spec: StreamSpec) -> None:
    if spec.all_changes_for_cluster:
        if db != "admin" or coll is not None:
            raise command_error(
                INVALID_OPTIONS,
                "A $changeStream with 'allChangesForCluster:true' may only be opened on the 'admin' database, "
                f"and with no collection name; found {db}.{coll or '$cmd.aggregate'}",
            )
        return
    if db == "admin":
        raise command_error(
            INVALID_NAMESPACE,
            "$changeStream may not be opened on the internal admin database"
            if coll is None
            else f"$changeStream may not be opened on the internal admin.{coll} collection",
        )
    if db in ("config", "local"):
        raise command_error(INVALID_NAMESPACE, f"$changeStream may not be opened on the internal {db} database")
    if coll is not None and coll.startswith("system."):
        raise command_error(INVALID_NAMESPACE, f"$changeStream may not be opened on the internal {db}.{coll} collection")


# -- user stages that only filter ------------------------------------------------------------------

EventFilter = Callable[[str, Mapping[str, Any]], bool]
_FILTER_FIELDS = frozenset({"operationType", "ns", "ns.db", "ns.coll"})


def compile_filter_stages(stages: Sequence[Mapping[str, Any]]) -> EventFilter | None:
    """A predicate on (operationType, ns) equal to running ``stages``, when they only filter.

    The connector's pipeline adds a field computed from ``ns`` (``$concat``), ``$match``es on it and
    on ``operationType``/``ns``, then removes the field again: the events that pass are the events
    as they came. Such a pipeline is compiled once per cursor and its events stay on the raw path
    (encoded from cached BSON, no per-event documents). Anything else returns None and runs as a
    pipeline.
    """
    steps: list[tuple[str, Any]] = []
    added: dict[str, Callable[[Mapping[str, Any]], Any]] = {}
    removed: set[str] = set()
    for stage in stages:
        name, spec = next(iter(stage.items()))
        if name == "$match":
            if not isinstance(spec, Mapping) or not _fields_known(spec, set(added)):
                return None
            predicate = compile_filter(spec)
            if predicate is None:
                return None
            steps.append(("match", predicate))
        elif name in ("$addFields", "$set"):
            if not isinstance(spec, Mapping) or not spec:
                return None
            for field, expression in spec.items():
                compute = _compile_concat(expression)
                if compute is None or "." in field or field in _FILTER_FIELDS or field.split(".")[0] in _TOP_EVENT_FIELDS:
                    return None
                added[field] = compute
                steps.append(("add", (field, compute)))
        elif name in ("$project", "$unset"):
            fields = _excluded_fields(spec)
            if fields is None or not fields <= set(added):
                return None
            removed |= fields
            steps.append(("remove", fields))
        else:
            return None
    if set(added) - removed:
        return None  # the output would carry an added field

    def passes(operation_type: str, ns: Mapping[str, Any]) -> bool:
        view: dict[str, Any] = {"operationType": operation_type, "ns": ns}
        for kind, step in steps:
            if kind == "match":
                if not step(view):
                    return False
            elif kind == "add":
                field, compute = step
                view[field] = compute(view)
            else:
                for field in step:
                    view.pop(field, None)
        return True

    return passes


_TOP_EVENT_FIELDS = frozenset({"_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey", "fullDocument",
                               "fullDocumentBeforeChange", "updateDescription", "txnNumber", "lsid", "to",
                               "collectionUUID", "operationDescription", "splitEvent"})  # fmt: skip


def _fields_known(query: Mapping[str, Any], added: set[str]) -> bool:
    """Whether a filter reads only fields the compiled view has."""
    for key, condition in query.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(condition, list) or not all(isinstance(p, Mapping) and _fields_known(p, added) for p in condition):
                return False
        elif key not in _FILTER_FIELDS and key not in added:
            return False
    return True


def _compile_concat(expression: Any) -> Callable[[Mapping[str, Any]], Any] | None:
    """``{$concat: [...]}`` of string literals and ``$ns.db`` / ``$ns.coll`` / ``$operationType``."""
    if not isinstance(expression, Mapping) or set(expression) != {"$concat"} or not isinstance(expression["$concat"], list):
        return None
    getters: list[Callable[[Mapping[str, Any]], Any]] = []
    for part in expression["$concat"]:
        if not isinstance(part, str):
            return None
        if part.startswith("$"):
            path = part[1:]
            if path not in ("ns.db", "ns.coll", "operationType"):
                return None
            getters.append(_view_getter(path))
        else:
            getters.append(_constant(part))

    def concat(view: Mapping[str, Any]) -> Any:
        values = [get(view) for get in getters]
        if any(not isinstance(value, str) for value in values):
            return None  # $concat of a missing or null value is null
        return "".join(values)

    return concat


def _view_getter(path: str) -> Callable[[Mapping[str, Any]], Any]:
    head, _, tail = path.partition(".")

    def get(view: Mapping[str, Any]) -> Any:
        value = view.get(head)
        return value.get(tail) if tail and isinstance(value, Mapping) else (None if tail else value)

    return get


def _constant(value: str) -> Callable[[Mapping[str, Any]], Any]:
    return lambda view: value


def _excluded_fields(spec: Any) -> set[str] | None:
    if isinstance(spec, str):
        return {spec}
    if isinstance(spec, list) and all(isinstance(field, str) for field in spec):
        return set(spec)
    if isinstance(spec, Mapping) and spec and all(value in (0, False) and not isinstance(value, float) for value in spec.values()):
        if "_id" in spec:
            return None
        return set(spec)
    return None


# -- the cursor -----------------------------------------------------------------------------------

_OUT_OF_SCOPE: dict[str, Any] = {}
# (token hex, token or None when it is just ``{_data: hex}``, clusterTime, event as a document or
# as encoded BSON). Queued events have the same shape with the event encoded.
_Pending = tuple[str, dict[str, Any] | None, Timestamp, Any]
_Ready = tuple[str, dict[str, Any] | None, Timestamp, bytes]
# A transaction's (txnNumber, lsid, the encoded txnNumber and lsid elements that precede ``_id``).
_Txn = tuple[Any, Any, bytes]
_INT32 = struct.Struct("<i")
_TIMESTAMP = struct.Struct("<II")


def _token(hex_: str, token: dict[str, Any] | None) -> dict[str, Any]:
    return token if token is not None else {"_data": hex_}


class ChangeStreamCursor:
    """One open change stream: reads the oplog from its start point and yields encoded events."""

    def __init__(
        self,
        host: ChangeStreamHost,
        db: str,
        coll: str | None,
        spec: StreamSpec,
        stages: list[dict[str, Any]],
        split: bool,
    ) -> None:
        self.host = host
        self.db = db
        self.coll = coll
        self.spec = spec
        self.stages = stages
        self.split = split
        self.kind = "cluster" if spec.all_changes_for_cluster else ("collection" if coll is not None else "database")
        self._oplog = host.oplog
        self._tokens = rt.EventTokenEncoder()
        self._ns_cache: dict[str, dict[str, Any]] = {}
        self._uuid_cache: dict[Any, uuid.UUID] = {}
        self._ready: deque[_Ready] = deque()
        self._closed = False
        self._closing = False
        self._failed: CommandError | None = None
        self._at_end = False
        self._expanded = spec.show_expanded_events
        self._migrations = spec.show_migration_events
        self._pre_mode = spec.full_document_before_change
        self._post_mode = spec.full_document
        self._needs_images = self._pre_mode != "off" or self._post_mode in ("whenAvailable", "required")
        # Without user stages (which need documents) CRUD events are encoded straight to BSON; stages
        # that only filter are compiled to a predicate and keep that path.
        self._filter = compile_filter_stages(stages) if stages else None
        self._passes: dict[tuple[str, str], bool] = {}  # the filter's verdict per (operationType, namespace)
        if self._filter is not None:
            self.stages = []
        self._raw_events = not self.stages
        self._ns_bytes: dict[str, bytes] = {}
        self._ui_elements: dict[bytes, bytes] = {}
        self._last_wall: Any = None
        self._last_wall_bytes = b""
        # Resume filter: events whose token is <= _resume_hex were already seen by the client.
        self._resume_hex: str | None = None
        self._resume_base_hex: str | None = None
        self._must_find = False
        self._found = False
        self._start_after_invalidate: str | None = None
        self._split_resume: str | None = None
        with self._oplog.cond:
            if spec.resume is not None:
                start = spec.resume.cluster_time
                self._check_history(start)
                self._resume_hex = str(spec.resume_token["_data"]).upper() if spec.resume_token else None
                self._pbrt: dict[str, Any] = {"_data": self._resume_hex}
                if spec.resume_token and "_typeBits" in spec.resume_token:
                    self._pbrt["_typeBits"] = spec.resume_token["_typeBits"]
                if not spec.resume.is_high_water_mark:
                    self._must_find = True
                    if spec.resume.fragment_num is not None:
                        base = rt.encode(
                            rt.ResumeTokenData(
                                spec.resume.cluster_time, spec.resume.version, spec.resume.token_type,
                                spec.resume.txn_op_index, spec.resume.from_invalidate, spec.resume.uuid,
                                spec.resume.event_identifier,
                            )
                        )
                        self._resume_base_hex = base["_data"]
                    if spec.resume.from_invalidate:
                        self._start_after_invalidate = self._resume_hex
            else:
                if spec.start_at_operation_time is not None:
                    start = spec.start_at_operation_time
                    self._check_history(start)
                else:
                    current = self._oplog.clock.current()
                    start = Timestamp(current.time, current.inc + 1)
                self._pbrt = rt.high_water_mark(start)
                self._resume_hex = self._pbrt["_data"]
        self._pbrt_ts = ts_key(start)
        self._scan_from: Timestamp = start
        self._scan_inclusive = True
        self._scanned_any = False

    # -- public API (see the emulator contract) ---------------------------------------------------
    @property
    def closed(self) -> bool:
        """True once the stream was invalidated and its last event returned."""
        return self._closed and not self._ready

    @property
    def post_batch_resume_token(self) -> dict[str, Any]:
        return self._pbrt

    def next_batch(self, batch_size: int | None, max_time_ms: int | None) -> list[bytes]:
        """The next batch of BSON-encoded events; waits up to ``max_time_ms`` for the first one."""
        if self._failed is not None:
            raise self._failed
        limit = batch_size if batch_size is not None and batch_size > 0 else None
        wait_ms = DEFAULT_AWAIT_MS if max_time_ms is None else max_time_ms
        deadline = time.monotonic() + wait_ms / 1000.0
        try:
            self._fill(limit)
            while not self._ready and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                if not self._oplog.wait_for_entries_after(self._last_seen(), remaining):
                    break  # timed out, or interrupted by a step-down
                self._fill(limit)
        except CommandError as exc:
            self._failed = exc
            raise
        return self._take(limit)

    # -- batching ------------------------------------------------------------------------------
    def _last_seen(self) -> Timestamp:
        """The newest oplog time the stream has no more interest in (for waiting on new entries)."""
        if not self._scan_inclusive:
            return self._scan_from
        start = self._scan_from
        return Timestamp(start.time, start.inc - 1) if start.inc else Timestamp(max(start.time - 1, 0), 0xFFFFFFFF)

    def _check_position(self) -> None:
        """Fail like mongod when the oplog was capped or truncated past the stream's position."""
        first = self._oplog.first_ts()
        if first is None or ts_key(first) <= ts_key(self._scan_from):
            return
        if not self._scanned_any:
            self._check_history(self._scan_from)
        position = ts_key(self._scan_from)
        raise command_error(
            CAPPED_POSITION_LOST,
            "CollectionScan died due to position in capped collection being deleted. "
            f"Last seen record id: RecordId({position[0] << 32 | position[1]})",
        )

    def _take(self, limit: int | None) -> list[bytes]:
        out: list[bytes] = []
        budget = BSON_OBJ_MAX_USER_SIZE
        ready = self._ready
        last: _Ready | None = None
        count = len(ready) if limit is None else min(limit, len(ready))
        append = out.append
        popleft = ready.popleft
        while count:
            size = len(ready[0][3])
            if size > budget and out:
                break
            last = popleft()
            budget -= size
            append(last[3])
            count -= 1
        if last is not None:
            self._pbrt = _token(last[0], last[1])
            self._pbrt_ts = ts_key(last[2])
        if not ready and self._at_end and self._scanned_any and not self._closed and not (self._must_find and not self._found):
            scanned = ts_key(self._scan_from)
            if scanned > self._pbrt_ts:
                self._pbrt = rt.high_water_mark(self._scan_from)
                self._pbrt_ts = scanned
        return out

    def _fill(self, limit: int | None) -> None:
        """Scan the oplog until enough events are ready (or the oplog end is reached)."""
        want = limit if limit is not None else 1 << 62
        ready = self._ready
        ready_bytes = sum(len(r[3]) for r in ready) if limit is None else 0
        while not self._closing and len(ready) < want and ready_bytes < BSON_OBJ_MAX_USER_SIZE:
            chunk = 512 if limit is None else max(16, min(512, want - len(ready)))
            with self._oplog.cond:
                self._check_position()
                entries = self._oplog.read(self._scan_from, inclusive=self._scan_inclusive, limit=chunk)
            self._at_end = len(entries) < chunk
            if not entries:
                return
            events: list[_Pending] = []
            entry_events = self._entry_events
            last = entries[-1]
            for entry in entries:
                entry_events(entry, events)
                if self._closing:
                    last = entry
                    break
            self._scan_from = last["ts"]
            self._scan_inclusive = False
            self._scanned_any = True
            before = len(ready)
            self._deliver(events)
            if limit is None:
                ready_bytes += sum(len(ready[i][3]) for i in range(before, len(ready)))
            if self._closing:
                self._closed = True
            if self._at_end:
                return

    def _deliver(self, events: list[_Pending]) -> None:
        """Run user stages, split or reject oversized events, encode, and queue."""
        if not events:
            return
        if self.stages:
            tokens = {hex_: (_token(hex_, token), ts) for hex_, token, ts, _ in events}
            outputs = self.host.run_pipeline([event for _, _, _, event in events], self.stages)
            staged: list[_Pending] = []
            for out in outputs:
                ident = out.get("_id")
                hex_ = ident.get("_data") if isinstance(ident, Mapping) else None
                if not isinstance(ident, Mapping) or hex_ not in tokens or dict(ident) != tokens[hex_][0]:
                    raise command_error(
                        CHANGE_STREAM_FATAL_ERROR,
                        "Encountered an event whose _id field, which contains the resume token, was modified by "
                        "the pipeline. Modifying the _id field of an event makes it impossible to resume the "
                        "stream from that point. Only transformations that retain the unmodified _id field are "
                        "allowed.",
                        NON_RESUMABLE,
                    )
                staged.append((hex_, *tokens[hex_], out))
            events = staged
        append = self._ready.append
        for item in events:
            hex_, token, ts, event = item
            if type(event) is bytes:
                raw = event
                if len(raw) <= MAX_CHANGE_EVENT_SIZE and self._split_resume is None:
                    append(item)  # the common case: an ordinary event, queued as it is
                    continue
            else:
                raw = encode_event(event)
            size = len(raw)
            full_token = _token(hex_, token)
            if size > MAX_CHANGE_EVENT_SIZE and self.split:
                seen = self._split_resume if hex_ == self._resume_base_hex else None
                self._split_resume = None
                as_doc = dict(bson.decode(raw, codec_options=CODEC_OPTIONS)) if isinstance(event, bytes) else event
                for frag_hex, frag_token, fragment in self._fragments(full_token, as_doc):
                    if seen is None or frag_hex > seen:
                        append((frag_hex, frag_token, ts, fragment))
                continue
            if self._split_resume is not None and hex_ == self._resume_base_hex:
                raise command_error(
                    CHANGE_STREAM_FATAL_ERROR,
                    "Attempted to resume from a split event fragment, but the event in the resumed stream was "
                    "not large enough to be split",
                    NON_RESUMABLE,
                )
            if size > BSON_OBJ_MAX_INTERNAL_SIZE:
                raise command_error(
                    BSON_OBJECT_TOO_LARGE,
                    f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and "
                    f"{BSON_OBJ_MAX_INTERNAL_SIZE}(16MB) First element: _id: {_format_value(full_token)}",
                )
            append((hex_, full_token, ts, raw))

    def _fragments(self, token: dict[str, Any], event: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], bytes]]:
        """Split an oversized event into fragments the way mongod's split stage does."""
        data = rt.decode(token)
        limit = MAX_CHANGE_EVENT_SIZE - len(bson.encode(token))
        sized = sorted(
            ((len(bson.encode({name: value}, codec_options=CODEC_OPTIONS)) - 5, name) for name, value in event.items()
             if name != "_id"),
        )
        fragments: list[tuple[dict[str, Any], list[str]]] = []
        i = 0
        while i < len(sized):
            frag_token = rt.encode(
                rt.ResumeTokenData(
                    data.cluster_time, data.version, data.token_type, data.txn_op_index,
                    data.from_invalidate, data.uuid, data.event_identifier, len(fragments),
                )
            )
            header = {"_id": frag_token, "splitEvent": {"fragment": len(fragments) + 1, "of": 0}}
            size = len(bson.encode(header)) + len(bson.encode({"$sortKey": [frag_token]})) - 5
            names = []
            while True:
                names.append(sized[i][1])
                size += sized[i][0]
                i += 1
                if i >= len(sized) or size + sized[i][0] > limit:
                    break
            if size > limit:
                raise _location(
                    7182500,
                    f"Splitting change event failed: fragment size {size} is greater than maximum allowed fragment "
                    f"size {limit}",
                )
            fragments.append((frag_token, names))
        out = []
        for number, (frag_token, names) in enumerate(fragments, start=1):
            doc: dict[str, Any] = {"_id": frag_token, "splitEvent": {"fragment": number, "of": len(fragments)}}
            for name in names:
                doc[name] = event[name]
            out.append((frag_token["_data"], frag_token, encode_event(doc)))
        return out

    # -- oplog entry -> events -----------------------------------------------------------------
    def _check_history(self, ts: Timestamp) -> None:
        if not self._oplog.covers(ts):
            raise command_error(
                CHANGE_STREAM_HISTORY_LOST,
                "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
                NON_RESUMABLE,
            )

    def _ns_info(self, ns: str) -> dict[str, Any]:
        """The event's ``ns`` document for a CRUD namespace, or ``_OUT_OF_SCOPE``."""
        info = self._ns_cache.get(ns)
        if info is not None:
            return info
        db, _, coll = ns.partition(".")
        if self.kind == "collection":
            in_scope = db == self.db and coll == self.coll
        elif self.kind == "database":
            in_scope = db == self.db and not coll.startswith("system.")
        else:
            in_scope = db not in INTERNAL_DATABASES and not coll.startswith("system.")
        info = {"db": db, "coll": coll} if in_scope and coll else _OUT_OF_SCOPE
        self._ns_cache[ns] = info
        return info

    def _db_in_scope(self, db: str) -> bool:
        if self.kind == "cluster":
            return db not in INTERNAL_DATABASES
        return db == self.db

    def _admit(self, hex_: str) -> bool:
        """The resume filter: drop events the client has already seen, check the token was found."""
        resume = self._resume_hex
        if resume is None:
            return True
        if self._resume_base_hex is not None and hex_ == self._resume_base_hex:
            # The client resumed from a fragment of this event: split it again, skip the seen fragments.
            self._found = True
            self._split_resume = resume
            self._resume_hex = None
            self._must_find = False
            return True
        if hex_ <= resume:
            if hex_ == resume:
                self._found = True
            return False
        if self._must_find and not self._found:
            raise command_error(
                CHANGE_STREAM_FATAL_ERROR,
                f"cannot resume stream; the resume token was not found. {{_data: \"{hex_}\"}}",
                NON_RESUMABLE,
            )
        self._resume_hex = None
        self._must_find = False
        return True

    def _entry_events(
        self, entry: Mapping[str, Any], out: list[_Pending]
    ) -> None:
        op = entry["op"]
        if op == "n" or (entry.get("fromMigrate") and not (self._migrations and op in ("i", "u", "d"))):
            return  # a migration's writes are not the application's (shown on a shard with showMigrationEvents)
        ts = entry["ts"]
        if op == "c" and "applyOps" in entry["o"]:
            if "lsid" not in entry:
                return
            prefix = b""
            if self._raw_events:
                prefix = b"\x12txnNumber\x00" + struct.pack("<q", int(entry["txnNumber"])) + _element(
                    "lsid", entry["lsid"]
                )
            txn: _Txn = (entry["txnNumber"], entry["lsid"], prefix)
            for index, inner in enumerate(entry["o"]["applyOps"]):
                self._op_events(inner, ts, entry["wall"], index, txn, out)
                if self._closing:
                    return
            return
        self._op_events(entry, ts, entry["wall"], 0, None, out)

    def _op_events(
        self,
        op_doc: Mapping[str, Any],
        ts: Timestamp,
        wall: Any,
        index: int,
        txn: _Txn | None,
        out: list[_Pending],
    ) -> None:
        op = op_doc["op"]
        if op == "c":
            self._command_event(op_doc, ts, wall, index, txn, out)
            return
        if op not in ("i", "u", "d"):
            return
        if self._raw_events:
            self._raw_crud_event(op_doc, op, ts, wall, index, txn, out)
            return
        ns = self._ns_info(op_doc["ns"])
        if ns is _OUT_OF_SCOPE:
            return
        o = op_doc["o"]
        ui = op_doc["ui"]
        event: dict[str, Any] = {}
        if txn is not None:
            event["txnNumber"] = Int64(txn[0])
            event["lsid"] = txn[1]
        if op == "i":
            key = op_doc.get("o2") or {"_id": o["_id"]}
            token = self._tokens.crud(ts, index, ui, "insert", key)
            hex_ = token["_data"]
            if not self._admit(hex_):
                return
            event["_id"] = token
            event["operationType"] = "insert"
            event["clusterTime"] = ts
            if self._expanded:
                event["collectionUUID"] = ui
            event["wallTime"] = wall
            event["fullDocument"] = o
            event["ns"] = ns
            event["documentKey"] = key
            out.append((hex_, token, ts, event))
            return
        if op == "d":
            key = o
            op_type = "delete"
        else:
            key = op_doc["o2"]
            op_type = "update" if o.get("$v") == 2 else "replace"
        token = self._tokens.crud(ts, index, ui, op_type, key)
        hex_ = token["_data"]
        if not self._admit(hex_):
            return
        event["_id"] = token
        event["operationType"] = op_type
        event["clusterTime"] = ts
        if self._expanded:
            event["collectionUUID"] = ui
        event["wallTime"] = wall
        if op_type == "replace":
            event["fullDocument"] = o
        event["ns"] = ns
        event["documentKey"] = key
        if op_type == "update":
            event["updateDescription"] = update_description(o["diff"], self._expanded)
        if self._needs_images or (op_type == "update" and self._post_mode == "updateLookup"):
            self._add_images(event, op_type, ui, ts, index, txn, ns, key)
        out.append((hex_, token, ts, event))

    def _raw_crud_event(
        self,
        op_doc: Mapping[str, Any],
        op: str,
        ts: Timestamp,
        wall: Any,
        index: int,
        txn: _Txn | None,
        out: list[_Pending],
    ) -> None:
        """A CRUD event encoded straight to BSON: the bytes ``encode_event`` gives the dict path's event.

        Constant elements (operationType, ns, wallTime within one millisecond, transaction
        fields) come from caches; the documents go through one ``bson.encode`` call.
        """
        ns_name = op_doc["ns"]
        ns_part = self._ns_bytes.get(ns_name)
        if ns_part is None:
            info = self._ns_info(ns_name)
            ns_part = b"" if info is _OUT_OF_SCOPE else _element("ns", info)
            self._ns_bytes[ns_name] = ns_part
        if not ns_part:
            return
        o = op_doc["o"]
        ui = op_doc["ui"]
        if op == "i":
            key = op_doc.get("o2") or {"_id": o["_id"]}
            op_type = "insert"
        elif op == "d":
            key = o
            op_type = "delete"
        else:
            key = op_doc["o2"]
            op_type = "update" if o.get("$v") == 2 else "replace"
        key_hex = rt.simple_key_hex(key)
        token: dict[str, Any] | None = None
        if key_hex is not None:
            hex_ = self._tokens.crud_hex(ts, index, ui, op_type, key_hex)
            hex_bytes = hex_.encode()
            id_element = b"".join((
                b"\x03_id\x00", _INT32.pack(len(hex_bytes) + 17), b"\x02_data\x00", _INT32.pack(len(hex_bytes) + 1),
                hex_bytes, b"\x00\x00",
            ))  # fmt: skip
        else:
            token = self._tokens.crud(ts, index, ui, op_type, key)
            hex_ = token["_data"]
            id_element = _element("_id", token)
        if self._resume_hex is not None and not self._admit(hex_):
            return
        if self._filter is not None:
            verdict = self._passes.get((op_type, ns_name))
            if verdict is None:
                verdict = self._passes[(op_type, ns_name)] = self._filter(op_type, self._ns_info(ns_name))
            if not verdict:
                return
        rest: dict[str, Any] = {}
        leading_document = op_type == "insert" or op_type == "replace"
        if leading_document:
            rest["fullDocument"] = o
        rest["ns"] = None  # placeholder keeping the field order; spliced from ns_part below
        rest["documentKey"] = key
        if op_type == "update":
            rest["updateDescription"] = update_description(o["diff"], self._expanded)
        images = b""
        if op != "i" and (self._needs_images or (op_type == "update" and self._post_mode == "updateLookup")):
            images = self._image_elements(op_type, ui, ts, index, txn, self._ns_info(ns_name), key)
        encoded = bson.encode(rest, codec_options=CODEC_OPTIONS)
        # The null ``ns`` placeholder follows fullDocument (type byte, "fullDocument\0", the document) if any.
        cut = 18 + _INT32.unpack_from(encoded, 18)[0] if leading_document else 4
        body = b"".join((
            txn[2] if txn is not None else b"",
            id_element,
            _OPERATION_TYPES[op_type],
            b"\x11clusterTime\x00",
            _TIMESTAMP.pack(ts.inc, ts.time),
            self._ui_element(ui) if self._expanded else b"",
            self._wall_element(wall),
            encoded[4:cut],
            ns_part,
            encoded[cut + 4 : -1],
            images,
        ))  # fmt: skip
        out.append((hex_, token, ts, _INT32.pack(len(body) + 5) + body + b"\x00"))

    def _ui_element(self, ui: Any) -> bytes:
        """The ``collectionUUID`` element of expanded events."""
        raw = bytes(ui) if isinstance(ui, bytes) else rt.as_uuid(ui).bytes
        element = self._ui_elements.get(raw)
        if element is None:
            element = self._ui_elements[raw] = _element("collectionUUID", ui)
        return element

    def _wall_element(self, wall: Any) -> bytes:
        """The ``wallTime`` BSON element; consecutive entries mostly share one millisecond."""
        if wall != self._last_wall:
            self._last_wall = wall
            self._last_wall_bytes = b"\x09wallTime\x00" + struct.pack("<q", _millis(wall))
        return self._last_wall_bytes

    def _image_elements(self, op_type: str, ui: Any, ts: Timestamp, index: int, txn: _Txn | None,
                        ns: Mapping[str, Any], document_key: Mapping[str, Any]) -> bytes:  # fmt: skip
        """The encoded ``fullDocumentBeforeChange`` / ``fullDocument`` elements ``_add_images`` adds,
        spliced from the stored documents' BSON."""
        images = None
        if self._needs_images:
            collection_uuid = self._uuid_cache.get(ui)
            if collection_uuid is None:
                collection_uuid = self._uuid_cache[ui] = rt.as_uuid(ui)
            images = self.host.change_stream_images_bson(collection_uuid, ts, index)
        pre, post = images if images is not None else (None, None)
        out = b""
        if self._pre_mode != "off":
            if pre is None and self._pre_mode == "required":
                raise command_error(
                    NO_MATCHING_DOCUMENT,
                    "Change stream was configured to require a pre-image for all update, delete and replace "
                    f"events, but the pre-image was not found for event: {_event_summary(op_type, ns, ts, txn)}",
                )
            out = _PRE_IMAGE_NULL if pre is None else _PRE_IMAGE_HEAD + pre
        if op_type != "update" or self._post_mode == "default":
            return out
        if self._post_mode == "updateLookup":
            post = self.host.lookup_document_bson(ns["db"], ns["coll"], dict(document_key))
        elif post is None and self._post_mode == "required":
            raise command_error(
                NO_MATCHING_DOCUMENT,
                "Change stream was configured to require a post-image for all update events, but the "
                f"post-image was not found for event: {_event_summary(op_type, ns, ts, txn)}",
            )
        return out + (_POST_IMAGE_NULL if post is None else _POST_IMAGE_HEAD + post)

    def _add_images(
        self,
        event: dict[str, Any],
        op_type: str,
        ui: Any,
        ts: Timestamp,
        index: int,
        txn: _Txn | None,
        ns: Mapping[str, Any],
        document_key: Mapping[str, Any],
    ) -> None:
        """Append ``fullDocumentBeforeChange`` / ``fullDocument`` (post-image) as the stream asks."""
        images: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] | None = None
        if self._needs_images:
            collection_uuid = self._uuid_cache.get(ui)
            if collection_uuid is None:
                collection_uuid = rt.as_uuid(ui)
                self._uuid_cache[ui] = collection_uuid
            images = self.host.change_stream_images(collection_uuid, ts, index)
        pre, post = images if images is not None else (None, None)
        post_image: Mapping[str, Any] | None = post
        if self._pre_mode != "off":
            if pre is None and self._pre_mode == "required":
                raise command_error(
                    NO_MATCHING_DOCUMENT,
                    "Change stream was configured to require a pre-image for all update, delete and replace "
                    f"events, but the pre-image was not found for event: {_event_summary(op_type, ns, ts, txn)}",
                )
            event["fullDocumentBeforeChange"] = pre
        if op_type != "update" or self._post_mode == "default":
            return
        if self._post_mode == "updateLookup":
            post_image = self.host.lookup_document(ns["db"], ns["coll"], dict(document_key))
        elif post is None and self._post_mode == "required":
            raise command_error(
                NO_MATCHING_DOCUMENT,
                "Change stream was configured to require a post-image for all update events, but the "
                f"post-image was not found for event: {_event_summary(op_type, ns, ts, txn)}",
            )
        event["fullDocument"] = post_image

    def _command_event(
        self,
        op_doc: Mapping[str, Any],
        ts: Timestamp,
        wall: Any,
        index: int,
        txn: _Txn | None,
        out: list[_Pending],
    ) -> None:
        o = op_doc["o"]
        db = op_doc["ns"].partition(".")[0]
        ui = op_doc.get("ui")
        first = next(iter(o), None)
        head: dict[str, Any] = {}
        description: Any = None
        state_before: dict[str, Any] | None = None
        invalidates = False
        if first == "drop":
            op_type, coll = "drop", o["drop"]
            if not self._coll_in_scope(db, coll):
                return
            invalidates = self.kind == "collection"
        elif first == "renameCollection":
            op_type = "rename"
            src_db, _, coll = str(o["renameCollection"]).partition(".")
            dst_db, _, dst_coll = str(o["to"]).partition(".")
            db = src_db
            to_doc = {"db": dst_db, "coll": dst_coll}
            if self.kind == "collection":
                if (src_db, coll) != (self.db, self.coll) and (dst_db, dst_coll) != (self.db, self.coll):
                    return
                invalidates = True
            elif not (self._coll_in_scope(src_db, coll) or self._coll_in_scope(dst_db, dst_coll)):
                return
            head["to"] = to_doc
            description = {k: v for k, v in o.items() if k not in ("renameCollection", "stayTemp")}
            description["to"] = to_doc
        elif first == "dropDatabase":
            op_type, coll = "dropDatabase", ""
            if self.kind == "collection" or not self._db_in_scope(db):
                return
            invalidates = self.kind == "database"
        elif self._expanded and first in ("create", "createIndexes", "collMod", "dropIndexes"):
            coll = o[first]
            if not self._coll_in_scope(db, coll):
                return
            rest = {k: v for k, v in o.items() if k != first}
            if first == "create":
                op_type, description = "create", rest
            elif first == "createIndexes":
                op_type, description = "createIndexes", {"indexes": [rest]}
            elif first == "dropIndexes":
                op_type = "dropIndexes"
                spec = {k: v for k, v in (op_doc.get("o2") or {}).items() if k != "dropIndexes"}
                description = {"indexes": [spec]}
            else:
                op_type, description = "modify", rest
                o2 = op_doc.get("o2") or {}
                state_before = {
                    k: o2[f"{k}_old"] for k in ("collectionOptions", "indexOptions") if f"{k}_old" in o2
                }
        else:
            return
        if op_type != "rename":
            ns_doc: dict[str, Any] = {"db": db, "coll": coll} if coll else {"db": db}
        else:
            ns_doc = {"db": db, "coll": coll}
        identifier: dict[str, Any] = {"operationType": op_type}
        if description is not None:
            identifier["operationDescription"] = description
        collection_uuid = rt.as_uuid(ui) if ui is not None else None
        data = rt.ResumeTokenData(ts, txn_op_index=index, uuid=collection_uuid, event_identifier=identifier)
        token = rt.encode(data)
        event: dict[str, Any] = dict(head)
        if txn is not None:
            event["txnNumber"] = Int64(txn[0])
            event["lsid"] = txn[1]
        event["_id"] = token
        event["operationType"] = op_type
        event["clusterTime"] = ts
        if self._expanded and ui is not None:
            event["collectionUUID"] = ui
        event["wallTime"] = wall
        event["ns"] = ns_doc
        if self._expanded and description is not None:
            event["operationDescription"] = description
        if state_before is not None:
            event["stateBeforeChange"] = state_before
        hex_ = token["_data"]
        if self._admit(hex_) and (self._filter is None or self._filter(op_type, ns_doc)):
            out.append((hex_, token, ts, event))
        if not invalidates:
            return
        inv_token = rt.encode(
            rt.ResumeTokenData(ts, txn_op_index=index, from_invalidate=True, uuid=collection_uuid,
                               event_identifier=identifier)
        )
        inv_hex = inv_token["_data"]
        if self._start_after_invalidate is not None:
            matches = inv_hex == self._start_after_invalidate
            self._start_after_invalidate = None
            if not matches:
                return
            self._admit(inv_hex)
            return
        invalidate = {"_id": inv_token, "operationType": "invalidate", "clusterTime": ts, "wallTime": wall}
        if self._admit(inv_hex) and (self._filter is None or self._filter("invalidate", {})):
            out.append((inv_hex, inv_token, ts, invalidate))
        self._closing = True

    def _coll_in_scope(self, db: str, coll: str) -> bool:
        if self.kind == "collection":
            return db == self.db and coll == self.coll
        if coll.startswith("system."):
            return False
        return self._db_in_scope(db)


_PRE_IMAGE_HEAD = b"\x03fullDocumentBeforeChange\x00"
_PRE_IMAGE_NULL = b"\x0afullDocumentBeforeChange\x00"
_POST_IMAGE_HEAD = b"\x03fullDocument\x00"
_POST_IMAGE_NULL = b"\x0afullDocument\x00"
_OPERATION_TYPES = {
    name: b"\x02operationType\x00" + struct.pack("<i", len(name) + 1) + name.encode() + b"\x00"
    for name in ("insert", "update", "replace", "delete")
}


def _element(name: str, value: Any) -> bytes:
    """One encoded BSON element (type, name, value) as nested in an event."""
    return bson.encode({name: value}, codec_options=CODEC_OPTIONS)[4:-1]
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


_NAIVE_EPOCH = datetime.datetime(1970, 1, 1)


def _millis(wall: Any) -> int:
    """Milliseconds since the epoch of an oplog ``wall`` value (naive datetimes are UTC)."""
    if isinstance(wall, datetime.datetime):
        delta = wall - (_NAIVE_EPOCH if wall.tzinfo is None else _EPOCH)
        return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000
    return int(wall)


def encode_event(event: Mapping[str, Any]) -> bytes:
    """BSON of an event in its own field order.

    pymongo's encoder always writes a top-level ``_id`` first, but mongod emits ``txnNumber`` and
    ``lsid`` (transaction events) and ``to`` (rename) before ``_id``; those events are spliced
    together from the fields before ``_id`` and the rest.
    """
    if next(iter(event)) == "_id":
        return bson.encode(event, codec_options=CODEC_OPTIONS)
    items = list(event.items())
    cut = next(i for i, (name, _) in enumerate(items) if name == "_id")
    head = bson.encode(dict(items[:cut]), codec_options=CODEC_OPTIONS)
    tail = bson.encode(dict(items[cut:]), codec_options=CODEC_OPTIONS)
    body = head[4:-1] + tail[4:-1]
    return (len(body) + 5).to_bytes(4, "little") + body + b"\x00"


def _event_summary(op_type: str, ns: Mapping[str, Any], ts: Timestamp, txn: _Txn | None) -> str:
    """mongod's ``Document::toString`` of ``{operationType, ns, clusterTime, txnNumber}``."""
    parts = [
        f"operationType: {_format_value(op_type)}",
        f"ns: {_format_value(ns)}",
        f"clusterTime: {_format_value(ts)}",
    ]
    if txn is not None:
        parts.append(f"txnNumber: {int(txn[0])}")
    return "{" + ", ".join(parts) + "}"


def _format_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    return str(value)
