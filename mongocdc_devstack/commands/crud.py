"""Data commands: insert, update, delete, find, getMore, killCursors, count, distinct, aggregate,
findAndModify, with mongod's reply shapes and write-error semantics (ordered/unordered)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import bson
from bson import Int64, Timestamp

from .. import matching
from ..cursors import DEFAULT_FIRST_BATCH, ListCursor, TailableCursor, cursor_document
from ..errors import BAD_VALUE, FAILED_TO_PARSE, INVALID_OPTIONS, TYPE_MISMATCH, CommandError, command_error
from ..state import Collection, StoredDoc, Transaction, check_namespace
from . import Context, command
from .admin import MAX_WRITE_BATCH_SIZE

INVALID_LENGTH = (16, "InvalidLength")


def _write_error(index: int, exc: CommandError) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": index, "code": exc.code}
    reply = exc.to_reply()
    for extra in ("keyPattern", "keyValue"):
        if extra in reply:
            entry[extra] = reply[extra]
    entry["errmsg"] = exc.errmsg
    return entry


def _statements(ctx: Context, field: str) -> list[Any]:
    value = ctx.cmd.get(field)
    if not isinstance(value, list):
        raise command_error(FAILED_TO_PARSE if value is None else TYPE_MISMATCH,
                            f"BSON field '{ctx.name}.{field}' is missing but a required field" if value is None
                            else f"BSON field '{ctx.name}.{field}' is the wrong type '{type(value).__name__}', expected type 'array'")  # fmt: skip
    if not value:
        raise command_error(INVALID_LENGTH, "Write batch sizes must be between 1 and 100000. Got 0 operations.")
    if len(value) > MAX_WRITE_BATCH_SIZE:
        raise command_error(
            INVALID_LENGTH, f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH_SIZE}. Got {len(value)} operations."
        )
    return value


def _abort_on_error(ctx: Context, errors: list[dict[str, Any]]) -> None:
    if errors and ctx.txn is not None:
        ctx.txn.state = "aborted"


def _run_statements(ctx: Context, items: list[Any], run: Callable[[int, Any], None]) -> list[dict[str, Any]]:
    ordered = ctx.cmd.get("ordered", True)
    errors: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        try:
            run(index, item)
        except CommandError as exc:
            if "TransientTransactionError" in exc.labels:
                raise  # mongod reports these as command errors, not write errors
            errors.append(_write_error(index, exc))
            if ordered or ctx.txn is not None:
                break
    _abort_on_error(ctx, errors)
    return errors


@command("insert", primary=True, in_transaction=True, write=True)
def insert(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    docs = _statements(ctx, "documents")
    count = 0

    def run(index: int, doc: Any) -> None:
        nonlocal count
        if not isinstance(doc, dict):
            raise command_error(TYPE_MISMATCH, "documents to insert must be objects")

        def execute() -> dict[str, Any]:
            ctx.state.insert_one(ctx.db, name, doc, ctx.txn)
            return {"n": 1}

        count += ctx.statement(index, execute)["n"]

    with ctx.state.batch():
        errors = _run_statements(ctx, docs, run)
    reply: dict[str, Any] = {"n": count}
    if errors:
        reply["writeErrors"] = errors
    return reply


@command("update", primary=True, in_transaction=True, write=True)
def update(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    statements = _statements(ctx, "updates")
    totals = {"n": 0, "nModified": 0}
    upserted: list[dict[str, Any]] = []

    def run(index: int, stmt: Any) -> None:
        if not isinstance(stmt, dict) or "q" not in stmt or "u" not in stmt:
            raise command_error(FAILED_TO_PARSE, "BSON field 'update.updates.q' is missing but a required field")
        multi = bool(stmt.get("multi", False))
        spec = stmt["u"]
        if multi and isinstance(spec, Mapping) and not matching.is_operator_update(spec):
            raise command_error(FAILED_TO_PARSE, "multi update is not supported for replacement-style update")
        _check_hint(ctx, name, stmt.get("hint"))

        def execute() -> dict[str, Any]:
            matched, modified, upserted_id, _, _ = ctx.state.update_documents(
                ctx.db, name, stmt["q"], spec, multi=multi, upsert=bool(stmt.get("upsert", False)),
                array_filters=stmt.get("arrayFilters"), txn=ctx.txn,
            )  # fmt: skip
            return {"n": matched, "nModified": modified, "upserted": upserted_id}

        result = ctx.statement(index, execute)
        totals["n"] += result["n"]
        totals["nModified"] += result["nModified"]
        if result["upserted"] is not None:
            totals["n"] += 1
            upserted.append({"index": index, "_id": result["upserted"]})

    with ctx.state.batch():
        errors = _run_statements(ctx, statements, run)
    reply: dict[str, Any] = dict(totals)
    if upserted:
        reply["upserted"] = upserted
    if errors:
        reply["writeErrors"] = errors
    return reply


@command("delete", primary=True, in_transaction=True, write=True)
def delete(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    statements = _statements(ctx, "deletes")
    removed = 0

    def run(index: int, stmt: Any) -> None:
        nonlocal removed
        if not isinstance(stmt, dict) or "q" not in stmt or "limit" not in stmt:
            raise command_error(FAILED_TO_PARSE, "BSON field 'delete.deletes.limit' is missing but a required field")
        limit = stmt["limit"]
        if limit not in (0, 1):
            raise command_error(FAILED_TO_PARSE, f"The limit field in delete objects must be 0 or 1. Got {limit}")
        _check_hint(ctx, name, stmt.get("hint"))
        removed += ctx.statement(index, lambda: {"n": len(ctx.state.delete_documents(ctx.db, name, stmt["q"], int(limit), ctx.txn))})["n"]

    with ctx.state.batch():
        errors = _run_statements(ctx, statements, run)
    reply: dict[str, Any] = {"n": removed}
    if errors:
        reply["writeErrors"] = errors
    return reply


@command("findAndModify", "findandmodify", primary=True, in_transaction=True, write=True)
def find_and_modify(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    cmd = ctx.cmd
    query = cmd.get("query") or {}
    sort = cmd.get("sort")
    remove = bool(cmd.get("remove", False))
    spec = cmd.get("update")
    fields = cmd.get("fields")
    if remove == (spec is not None):
        raise command_error(FAILED_TO_PARSE, "Either an update or remove=true must be specified")
    if remove and (cmd.get("new") or cmd.get("upsert")):
        raise command_error(FAILED_TO_PARSE, "Cannot specify both an update and remove=true" if spec is not None
                            else "Cannot specify both new=true and remove=true; 'remove' always returns the deleted document")  # fmt: skip
    _check_hint(ctx, name, cmd.get("hint"))

    def execute() -> dict[str, Any]:
        with ctx.state.lock:
            if remove:
                victims = ctx.state.delete_documents(ctx.db, name, query, 1, ctx.txn, sort=sort)
                ctx.state.flush_journal()
                value = victims[0] if victims else None
                return {"lastErrorObject": {"n": len(victims)}, "value": matching.project(value, fields) if value else None}
            matched, _, upserted_id, pre, post = ctx.state.update_documents(
                ctx.db, name, query, spec, multi=False, upsert=bool(cmd.get("upsert", False)),
                array_filters=cmd.get("arrayFilters"), txn=ctx.txn, sort=sort,
            )  # fmt: skip
            ctx.state.flush_journal()
        last_error: dict[str, Any] = {"n": 1 if (matched or upserted_id is not None) else 0, "updatedExisting": bool(matched)}
        if upserted_id is not None:
            last_error["upserted"] = upserted_id
        value = post if cmd.get("new") else (pre if matched else None)
        return {"lastErrorObject": last_error, "value": matching.project(value, fields) if value is not None else None}

    return dict(ctx.statement(0, execute))


# --------------------------------------------------------------------------------------------
# reads
# --------------------------------------------------------------------------------------------
def _check_hint(ctx: Context, name: str, hint: Any) -> None:
    if hint is None or hint == {} or hint == "":
        return
    if isinstance(hint, Mapping) and set(hint) == {"$natural"}:
        return
    coll = ctx.state.get_collection(ctx.db, name)
    if coll is None:
        return
    for index in coll.indexes.values():
        if (isinstance(hint, str) and index.name == hint) or (isinstance(hint, Mapping) and dict(index.spec["key"]) == dict(hint)):
            return
    raise command_error(BAD_VALUE, "hint provided does not correspond to an existing index")


def _first_batch_size(ctx: Context, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise command_error(TYPE_MISMATCH, f"BSON field '{ctx.name}.batchSize' is the wrong type")
    if value < 0:
        raise command_error(BAD_VALUE, f"BSON field 'batchSize' value must be >= 0, actual value '{int(value)}'")
    return int(value)


def _cursor_reply(ctx: Context, cursor: Any, ns: str, batch_size: int | None, single: bool, key: str) -> dict[str, Any]:
    """Produce a batch from ``cursor``; register it if more remains (cursor id 0 otherwise)."""
    if batch_size == 0:
        batch: list[bytes] = []
    else:
        batch = cursor.next_batch(batch_size, 0)
    cursor_id = 0
    if not single and not cursor.exhausted:
        if isinstance(cursor, ListCursor):
            cursor.time_limited = bool(ctx.cmd.get("maxTimeMS"))
        cursor_id = ctx.cursors.register(cursor)
    else:
        cursor.close()
    extra = cursor.extra_fields()
    if ctx.read_at is not None:
        extra = {**extra, "atClusterTime": ctx.read_at}
    return {"cursor": cursor_document(cursor_id, ns, key, batch, extra)}


def _encode_stored(stored: StoredDoc) -> bytes:
    return stored[1]


def _encoder(projection: Mapping[str, Any] | None) -> Callable[[Any], bytes]:
    if not projection:
        return _encode_stored
    projection = dict(projection)

    def encode(stored: StoredDoc) -> bytes:
        return bson.encode(matching.project(stored[0], projection))

    return encode


def _validate_projection(projection: Any) -> None:
    if projection is not None and not isinstance(projection, Mapping):
        raise command_error(TYPE_MISMATCH, "projection must be an object")
    if projection:
        matching.project({}, projection)


def _oplog_entries(query: Mapping[str, Any], sort: Mapping[str, Any] | None, oplog: Any) -> list[dict[str, Any]]:
    """Oplog reads: a ``ts`` range narrows by binary search, the rest is filtered normally."""
    lower: Timestamp | None = None
    inclusive = True
    cond = query.get("ts")
    if isinstance(cond, Mapping):
        if isinstance(cond.get("$gte"), Timestamp):
            lower, inclusive = cond["$gte"], True
        elif isinstance(cond.get("$gt"), Timestamp):
            lower, inclusive = cond["$gt"], False
    elif isinstance(cond, Timestamp):
        lower, inclusive = cond, True
    entries = oplog.read(lower, inclusive=inclusive) if lower is not None else list(oplog.entries())
    if query:
        entries = matching.filter_documents(entries, query)
    if sort:
        natural = sort.get("$natural")
        if natural is not None and len(sort) == 1:
            if natural < 0:
                entries = list(reversed(entries))
        else:
            entries = matching.sort_documents(entries, sort)
    return entries


# The fields mongod 7.0's find parser knows (find_command.idl) plus the generic arguments every
# command accepts (generic_argument.idl); anything else is rejected with 40415, as mongod does.
_FIND_FIELDS = frozenset(
    {"find", "filter", "projection", "sort", "hint", "skip", "limit", "batchSize", "singleBatch", "let", "max",
     "min", "returnKey", "showRecordId", "tailable", "oplogReplay", "noCursorTimeout", "awaitData",
     "allowPartialResults", "collation", "allowDiskUse", "readOnce", "allowSpeculativeMajorityRead",
     "$_requestResumeToken", "$_resumeAfter", "$_startAt", "term", "includeQueryStatsMetrics",
     "encryptionInformation", "isTimeseriesNamespace", "mirrored"}
)
GENERIC_ARGUMENTS = frozenset(
    {"apiVersion", "apiStrict", "apiDeprecationErrors", "$db", "maxTimeMS", "readConcern", "writeConcern", "lsid",
     "clientOperationKey", "txnNumber", "autocommit", "startTransaction", "stmtId", "comment", "$readPreference",
     "$clusterTime", "$audit", "$client", "$configServerState", "allowImplicitCollectionCreation",
     "$oplogQueryData", "$queryOptions", "$replData", "databaseVersion", "help", "shardVersion", "tracking_info",
     "coordinator", "maxTimeMSOpOnly", "usesDefaultMaxTimeMS", "mayBypassWriteBlocking", "$gleStats",
     "$configTime", "$topologyTime", "readOnly", "$traceCtx"}
)


@command("find", primary=True, in_transaction=True)
def find(ctx: Context) -> dict[str, Any]:
    for field in ctx.cmd:
        if field not in _FIND_FIELDS and field not in GENERIC_ARGUMENTS:
            raise command_error((40415, "Location40415"), f"BSON field 'find.{field}' is an unknown field.")
    name = ctx.collection_name()
    check_namespace(ctx.db, name)
    cmd = ctx.cmd
    query = ctx.get("filter", Mapping) or {}
    projection = ctx.get("projection", Mapping)
    sort = ctx.get("sort", Mapping)
    skip = ctx.get_int("skip", 0, minimum=0) or 0
    limit = ctx.get_int("limit", 0) or 0
    batch_size = _first_batch_size(ctx, cmd.get("batchSize"))
    single = bool(cmd.get("singleBatch", False))
    if limit < 0:
        raise command_error(BAD_VALUE, f"BSON field 'limit' value must be >= 0, actual value '{limit}'")
    if cmd.get("tailable"):
        raise command_error(matching.NOT_IMPLEMENTED, "tailable find cursors are not supported by the emulator")
    matching.validate_filter(query)
    matching.parse_sort(sort)
    _validate_projection(projection)
    _check_hint(ctx, name, cmd.get("hint"))
    ns = f"{ctx.db}.{name}"
    if limit and (batch_size is None or batch_size > limit):
        batch_size = limit
    if batch_size is None:
        batch_size = DEFAULT_FIRST_BATCH
    if ctx.db == "local" and name == "oplog.rs":
        entries = _oplog_entries(query, sort, ctx.state.oplog)[skip:]
        cursor = ListCursor(ns, entries, lambda doc: bson.encode(matching.project(doc, projection)), limit)
        return _cursor_reply(ctx, cursor, ns, batch_size, single, "firstBatch")
    hint = cmd.get("hint")
    if isinstance(hint, Mapping) and set(hint) == {"$natural"} and not sort:
        sort = {"$natural": hint["$natural"]}
    coll = ctx.read_collection(name)
    items: list[StoredDoc]
    if coll is None:
        items = []
    elif not query and not sort:
        with ctx.state.lock:
            items = list(coll.docs.values())
        items = items[skip:] if skip else items
    else:
        items = ctx.state.match_stored(coll, query, sort=sort, skip=skip)
    cursor = ListCursor(ns, items, _encoder(projection), limit)
    return _cursor_reply(ctx, cursor, ns, batch_size, single, "firstBatch")


@command("getMore", primary=True, in_transaction=True)
def get_more(ctx: Context) -> dict[str, Any]:
    cursor_id = ctx.arg
    if isinstance(cursor_id, bool) or not isinstance(cursor_id, int):
        raise command_error(TYPE_MISMATCH, f"BSON field 'getMore.getMore' is the wrong type '{type(cursor_id).__name__}', expected type 'long'")
    name = ctx.cmd.get("collection")
    if not isinstance(name, str) or not name:
        raise command_error(FAILED_TO_PARSE, "BSON field 'getMore.collection' is missing but a required field")
    batch_size = _first_batch_size(ctx, ctx.cmd.get("batchSize"))
    max_time_ms = ctx.get_int("maxTimeMS", None, minimum=0)
    ns = f"{ctx.db}.{name}"
    cursor = ctx.cursors.checkout(int(cursor_id), ns)
    try:
        ctx.server.faults.after_cursor_checkout()
        if getattr(cursor, "time_limited", False):
            ctx.server.faults.check_max_time()  # the cursor's maxTimeMS applies to each of its getMores
        if isinstance(cursor, TailableCursor):
            batch = cursor.next_batch(batch_size or None, 1000 if max_time_ms is None else max_time_ms)
        else:
            batch = cursor.next_batch(batch_size or None, max_time_ms)
        extra = cursor.extra_fields()
        exhausted = cursor.exhausted
    finally:
        ctx.cursors.release(int(cursor_id), cursor)
    return {"cursor": cursor_document(0 if exhausted else int(cursor_id), ns, "nextBatch", batch, extra)}


@command("killCursors", in_transaction=True)
def kill_cursors(ctx: Context) -> dict[str, Any]:
    ctx.collection_name()
    ids = ctx.cmd.get("cursors")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise command_error(TYPE_MISMATCH, "BSON field 'killCursors.cursors' must be an array of cursor ids")
    killed, missing = ctx.cursors.kill(ids)
    return {
        "cursorsKilled": [Int64(i) for i in killed],
        "cursorsNotFound": [Int64(i) for i in missing],
        "cursorsAlive": [],
        "cursorsUnknown": [],
    }


def _docs_for_read(ctx: Context, name: str) -> Collection | None:
    check_namespace(ctx.db, name)
    return ctx.read_collection(name)


@command("count", primary=True)
def count(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    query = ctx.get("query", Mapping) or {}
    skip = ctx.get_int("skip", 0, minimum=0) or 0
    limit = abs(ctx.get_int("limit", 0) or 0)
    matching.validate_filter(query)
    _check_hint(ctx, name, ctx.cmd.get("hint"))
    if ctx.db == "local" and name == "oplog.rs":
        total = len(_oplog_entries(query, None, ctx.state.oplog))
    else:
        coll = _docs_for_read(ctx, name)
        if coll is None:
            total = 0
        elif not query:
            total = len(coll.docs)
        else:
            total = len(ctx.state.match_stored(coll, query))
    total = max(0, total - skip)
    if limit:
        total = min(total, limit)
    return {"n": total}


@command("distinct", primary=True, in_transaction=True)
def distinct(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    key = ctx.cmd.get("key")
    if not isinstance(key, str):
        raise command_error(FAILED_TO_PARSE if key is None else TYPE_MISMATCH,
                            "BSON field 'distinct.key' is missing but a required field" if key is None
                            else "BSON field 'distinct.key' is the wrong type, expected type 'string'")  # fmt: skip
    query = ctx.get("query", Mapping) or {}
    matching.validate_filter(query)
    coll = _docs_for_read(ctx, name)
    seen: dict[Any, Any] = {}
    if coll is not None:
        for doc in ctx.state.match(coll, query):
            for value in matching._path_values(doc, key.split(".")):
                for item in value if isinstance(value, list) else [value]:
                    seen.setdefault(matching.bson_sort_key(item), item)
    values = [seen[k] for k in sorted(seen)]
    if ctx.read_at is not None:
        return {"values": values, "atClusterTime": ctx.read_at}
    return {"values": values}


def _pipeline_resolver(ctx: Context, txn: Transaction | None) -> Callable[[str], list[dict[str, Any]]]:
    def resolve(name: str) -> list[dict[str, Any]]:
        coll = ctx.state.get_collection(ctx.db, name, txn)
        if coll is None:
            return []
        with ctx.state.lock:
            return [d for d, _ in coll.docs.values()]

    return resolve


@command("aggregate", primary=True, in_transaction=True)
def aggregate(ctx: Context) -> dict[str, Any]:
    target = ctx.arg
    pipeline = matching.validate_pipeline(ctx.cmd.get("pipeline"))
    cursor_opts = ctx.cmd.get("cursor")
    if ctx.cmd.get("explain"):
        raise command_error(matching.NOT_IMPLEMENTED, "explain is not supported by the emulator")
    if not isinstance(cursor_opts, Mapping):
        raise command_error(FAILED_TO_PARSE, "The 'cursor' option is required, except for aggregate with the explain argument")
    batch_size = _first_batch_size(ctx, cursor_opts.get("batchSize"))
    if target == 1 or (isinstance(target, (int, float)) and not isinstance(target, bool) and target == 1):
        name = None
        ns = f"{ctx.db}.$cmd.aggregate"
    elif isinstance(target, str) and target:
        name = target
        check_namespace(ctx.db, name)
        ns = f"{ctx.db}.{name}"
    else:
        raise command_error(FAILED_TO_PARSE, "Invalid aggregate namespace: 'aggregate' must be a collection name or 1")
    if pipeline and "$changeStream" in pipeline[0]:
        if ctx.txn is not None:
            raise command_error((263, "OperationNotSupportedInTransaction"), "Cannot run aggregate with $changeStream in a multi-document transaction.")
        from .. import changestream

        source = changestream.open_change_stream(ctx.state, ctx.db, name, pipeline, ctx.cmd)
        stream = TailableCursor(ns, source)
        first_size = DEFAULT_FIRST_BATCH if batch_size is None else batch_size
        batch = stream.next_batch(first_size, 0) if first_size != 0 else []
        cursor_id = 0 if stream.exhausted else ctx.cursors.register(stream)
        return {"cursor": cursor_document(cursor_id, ns, "firstBatch", batch, stream.extra_fields())}
    for stage in pipeline[1:]:
        if "$changeStream" in stage:
            raise command_error((40602, "Location40602"), "$changeStream is only valid as the first stage in a pipeline")
    for stage in pipeline[:-1]:
        stage_name = next(iter(stage))
        if stage_name in ("$out", "$merge"):
            raise command_error((40601, "Location40601"), f"{stage_name} can only be the final stage in the pipeline")
    if name is None:
        docs: list[dict[str, Any]] = []
        first = next(iter(pipeline[0])) if pipeline else None
        if first == "$documents":
            value = pipeline[0]["$documents"]
            if not isinstance(value, list):
                raise command_error((5858203, "Location5858203"), "an array is expected")
            docs = list(value)
            pipeline = pipeline[1:]
        elif first not in ("$currentOp", "$listLocalSessions"):
            raise command_error(INVALID_OPTIONS if first else FAILED_TO_PARSE,
                                f"{first} is not allowed in a collectionless aggregate" if first
                                else "aggregate with 'aggregate: 1' requires a collectionless first stage")  # fmt: skip
        else:
            pipeline = pipeline[1:]
    elif ctx.db == "local" and name == "oplog.rs":
        docs = list(ctx.state.oplog.entries())
    else:
        coll = ctx.read_collection(name)
        if coll is None:
            docs = []
        else:
            with ctx.state.lock:
                docs = [d for d, _ in coll.docs.values()]
    results = matching.run_pipeline(docs, pipeline, _pipeline_resolver(ctx, ctx.txn))
    cursor = ListCursor(ns, results, _encode_checked)
    return _cursor_reply(ctx, cursor, ns, DEFAULT_FIRST_BATCH if batch_size is None else batch_size, False, "firstBatch")


def _encode_checked(doc: dict[str, Any]) -> bytes:
    raw = bson.encode(doc)
    if len(raw) > 16 * 1024 * 1024:
        raise command_error((10334, "BSONObjectTooLarge"), f"BSONObj size: {len(raw)} (0x{len(raw):X}) is invalid. Size must be between 0 and 16793600(16MB)")
    return raw
