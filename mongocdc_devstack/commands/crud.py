"""Data commands: insert, update, delete, find, getMore, killCursors, count, distinct, aggregate,
findAndModify, with mongod's reply shapes and write-error semantics (ordered/unordered)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import bson
from bson import Int64, ObjectId, Timestamp

from .. import matching
from ..cursors import DEFAULT_FIRST_BATCH, ListCursor, TailableCursor, TailableFindCursor, cursor_document
from ..errors import (
    BAD_VALUE,
    FAILED_TO_PARSE,
    ILLEGAL_OPERATION,
    INVALID_OPTIONS,
    TYPE_MISMATCH,
    CommandError,
    command_error,
)
from ..state import (
    Collection,
    DuplicateKeyError,
    IdKey,
    Index,
    ServerState,
    StoredDoc,
    Transaction,
    check_namespace,
    format_value,
)
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
    bypass = bool(ctx.cmd.get("bypassDocumentValidation"))
    count = 0

    def run(index: int, doc: Any) -> None:
        nonlocal count
        if not isinstance(doc, dict):
            raise command_error(TYPE_MISMATCH, "documents to insert must be objects")

        def execute() -> dict[str, Any]:
            ctx.state.insert_one(ctx.db, name, doc, ctx.txn, bypass)
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

    variables = _let(ctx)
    bypass = bool(ctx.cmd.get("bypassDocumentValidation"))
    for stmt in statements:  # mongod parses the whole command before running any of it
        if isinstance(stmt, Mapping):
            _known_fields(stmt, _UPDATE_STATEMENT_FIELDS, "update.updates")

    def run(index: int, stmt: Any) -> None:
        if not isinstance(stmt, dict) or "q" not in stmt or "u" not in stmt:
            raise command_error(FAILED_TO_PARSE, "BSON field 'update.updates.q' is missing but a required field")
        multi = bool(stmt.get("multi", False))
        spec = matching.bind_variables(stmt["u"], variables) if isinstance(stmt["u"], list) else stmt["u"]
        if multi and isinstance(spec, Mapping) and not matching.is_operator_update(spec):
            raise command_error(FAILED_TO_PARSE, "multi update is not supported for replacement-style update")
        _check_hint(ctx, name, stmt.get("hint"))
        query = matching.bind_variables(stmt["q"], variables)
        collation = matching.collation_key(stmt.get("collation"))

        def execute() -> dict[str, Any]:
            matched, modified, upserted_id, _, _ = ctx.state.update_documents(
                ctx.db, name, query, spec, multi=multi, upsert=bool(stmt.get("upsert", False)),
                array_filters=stmt.get("arrayFilters"), txn=ctx.txn, collation=collation, bypass_validation=bypass,
            )  # fmt: skip
            return {"n": matched, "nModified": modified, "upserted": upserted_id}

        result = ctx.statement(index, execute)
        totals["n"] += result["n"]
        totals["nModified"] += result["nModified"]
        if result["upserted"] is not None:
            totals["n"] += 1
            upserted.append({"index": index, "_id": result["upserted"][0]})

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

    variables = _let(ctx)
    for stmt in statements:
        if isinstance(stmt, Mapping):
            _known_fields(stmt, _DELETE_STATEMENT_FIELDS, "delete.deletes")

    def run(index: int, stmt: Any) -> None:
        nonlocal removed
        if not isinstance(stmt, dict) or "q" not in stmt or "limit" not in stmt:
            raise command_error(FAILED_TO_PARSE, "BSON field 'delete.deletes.limit' is missing but a required field")
        limit = stmt["limit"]
        if limit not in (0, 1):
            raise command_error(FAILED_TO_PARSE, f"The limit field in delete objects must be 0 or 1. Got {limit}")
        _check_hint(ctx, name, stmt.get("hint"))
        query = matching.bind_variables(stmt["q"], variables)
        collation = matching.collation_key(stmt.get("collation"))

        def execute() -> dict[str, Any]:
            return {"n": len(ctx.state.delete_documents(ctx.db, name, query, int(limit), ctx.txn, collation=collation))}

        removed += ctx.statement(index, execute)["n"]

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
    variables = _let(ctx)
    query = matching.bind_variables(cmd.get("query") or {}, variables)
    sort = cmd.get("sort")
    remove = bool(cmd.get("remove", False))
    spec = cmd.get("update")
    if isinstance(spec, list):
        spec = matching.bind_variables(spec, variables)
    collation = matching.collation_key(cmd.get("collation"))
    bypass = bool(cmd.get("bypassDocumentValidation"))
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
                victims = ctx.state.delete_documents(ctx.db, name, query, 1, ctx.txn, sort=sort, collation=collation)
                ctx.state.flush_journal()
                value = victims[0] if victims else None
                return {"lastErrorObject": {"n": len(victims)}, "value": matching.project(value, fields) if value else None}
            matched, _, upserted_id, pre, post = ctx.state.update_documents(
                ctx.db, name, query, spec, multi=False, upsert=bool(cmd.get("upsert", False)),
                array_filters=cmd.get("arrayFilters"), txn=ctx.txn, sort=sort, collation=collation,
                bypass_validation=bypass,
            )  # fmt: skip
            ctx.state.flush_journal()
        last_error: dict[str, Any] = {"n": 1 if (matched or upserted_id is not None) else 0, "updatedExisting": bool(matched)}
        if upserted_id is not None:
            last_error["upserted"] = upserted_id[0]
        value = post if cmd.get("new") else (pre if matched else None)
        return {"lastErrorObject": last_error, "value": matching.project(value, fields) if value is not None else None}

    return dict(ctx.statement(0, execute))


# The fields of one update / delete statement mongod 7.0 accepts (write_ops.idl): 7.0 has no ``sort``.
_UPDATE_STATEMENT_FIELDS = frozenset({"q", "u", "c", "multi", "upsert", "upsertSupplied", "arrayFilters", "hint", "collation",
                                      "sampleId", "$_allowShardKeyUpdatesWithoutFullShardKeyInQuery"})  # fmt: skip
_DELETE_STATEMENT_FIELDS = frozenset({"q", "limit", "hint", "collation", "sampleId"})


def _known_fields(stmt: Mapping[str, Any], known: frozenset[str], where: str) -> None:
    for field in stmt:
        if field not in known:
            raise command_error((40415, "Location40415"), f"BSON field '{where}.{field}' is an unknown field.")


def _let(ctx: Context) -> dict[str, Any] | None:
    """The command's ``let`` variables (mongod 5.0+), validated."""
    variables = ctx.cmd.get("let")
    if variables is None:
        return None
    if not isinstance(variables, Mapping):
        raise command_error(TYPE_MISMATCH, f"BSON field '{ctx.name}.let' is the wrong type '{type(variables).__name__}', expected type 'object'")
    # A variable's value is itself an expression of constants (``$literal`` keeps a string as it is).
    return {name: matching.evaluate_constant(value) for name, value in variables.items()}


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


def _oplog_entries(
    query: Mapping[str, Any], sort: Mapping[str, Any] | None, oplog: Any, needed: int = 0,
) -> list[dict[str, Any]]:
    """Oplog reads: a ``ts`` range narrows by binary search, the rest is filtered normally. ``needed``: how
    many entries the read can return at most (skip + limit; 0: no limit). Read in oplog order with no
    condition but a lower ``ts`` bound, only those are read, as mongod's scan stops at its limit (the
    connector's check of its position reads the oldest entry at every start: the whole oplog copied
    for it took half a second with a million entries)."""
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
    bound_only = not query or (set(query) == {"ts"} and lower is not None and (not isinstance(cond, Mapping) or len(cond) == 1))
    in_order = not sort or (set(sort) == {"$natural"} and sort["$natural"] >= 0)
    limit = needed if needed > 0 and bound_only and in_order else None
    entries = oplog.read(lower, inclusive=inclusive, limit=limit)
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
    query = matching.bind_variables(query, _let(ctx))
    matching.validate_filter(query)
    matching.parse_sort(sort)
    _validate_projection(projection)
    _check_hint(ctx, name, cmd.get("hint"))
    collation = matching.collation_key(cmd.get("collation"))
    ns = f"{ctx.db}.{name}"
    if limit and (batch_size is None or batch_size > limit):
        batch_size = limit
    if batch_size is None:
        batch_size = DEFAULT_FIRST_BATCH
    if cmd.get("tailable"):
        cursor: Any = _tailable_cursor(ctx, name, query, projection, bool(cmd.get("awaitData")), skip, limit)
        return _cursor_reply(ctx, cursor, ns, batch_size, single, "firstBatch")
    if ctx.db == "local" and name == "oplog.rs":
        entries = _oplog_entries(query, sort, ctx.state.oplog, skip + limit if limit else 0)[skip:]
        cursor = ListCursor(ns, entries, lambda doc: bson.encode(matching.project(doc, projection)), limit)
        return _cursor_reply(ctx, cursor, ns, batch_size, single, "firstBatch")
    hint = cmd.get("hint")
    if isinstance(hint, Mapping) and set(hint) == {"$natural"} and not sort:
        sort = {"$natural": hint["$natural"]}
    coll = ctx.read_collection(name)
    index = _hinted_index(coll, hint) if coll is not None else None
    bounds = (cmd.get("min"), cmd.get("max"))
    if bounds != (None, None) and index is None:
        raise command_error((51173, "Location51173"), "When using min()/max() a hint of which index to use must be provided")
    items: list[StoredDoc]
    if coll is None:
        items = []
    elif index is not None:
        # An index hint reads in index order (within min/max): sort there, then skip.
        ordered = ctx.state.match_stored(coll, query, sort=sort or dict(index.spec["key"]), collation=collation)
        items = _index_bounds(ordered, index, *bounds)[skip:]
    elif not query and not sort and collation is None:
        with ctx.state.lock:
            items = list(coll.docs.values())
        items = items[skip:] if skip else items
    else:  # the limit too: a sorted find_one reads one document off the _id index, not the collection
        items = ctx.state.match_stored(coll, query, sort=sort, skip=skip, limit=limit, collation=collation)
    cursor = ListCursor(ns, items, _encoder(projection), limit)
    return _cursor_reply(ctx, cursor, ns, batch_size, single, "firstBatch")


def _hinted_index(coll: Collection, hint: Any) -> Index | None:
    """The index a ``hint`` names (None for no hint or ``$natural``)."""
    if hint is None or hint in ({}, "") or (isinstance(hint, Mapping) and "$natural" in hint):
        return None
    for index in coll.indexes.values():
        if (isinstance(hint, str) and index.name == hint) or (isinstance(hint, Mapping) and dict(index.spec["key"]) == dict(hint)):
            return index
    return None


def _index_bounds(items: list[StoredDoc], index: Index, low: Any, high: Any) -> list[StoredDoc]:
    """The documents of an index scan: a sparse or partial index skips documents, and ``min``
    (inclusive) / ``max`` (exclusive) bound the index keys in the index's order."""
    pattern = list(index.spec["key"].items())
    for bound in (low, high):
        if bound is not None and (not isinstance(bound, Mapping) or list(bound) != [field for field, _ in pattern]):
            raise command_error((51174, "Location51174"), "The index chosen is not consistent with min/max")

    def compare(doc: Mapping[str, Any], bound: Mapping[str, Any]) -> int:
        for field, direction in pattern:
            value = matching.get_path(doc, field)
            mine = matching.bson_sort_key(None if value is matching._MISSING else value)
            theirs = matching.bson_sort_key(bound[field])
            if mine != theirs:
                order = -1 if mine < theirs else 1
                return order if not (isinstance(direction, (int, float)) and direction < 0) else -order
        return 0

    out = []
    for stored in items:
        if index.spec.get("sparse") or index.spec.get("partialFilterExpression"):
            if index.key_of(stored[0]) is None:
                continue
        if low is not None and compare(stored[0], low) < 0:
            continue
        if high is not None and compare(stored[0], high) >= 0:
            continue
        out.append(stored)
    return out


def _tailable_cursor(ctx: Context, name: str, query: Mapping[str, Any], projection: Mapping[str, Any] | None,
                     await_data: bool, skip: int, limit: int) -> TailableFindCursor:  # fmt: skip
    """A tailable (optionally awaitData) cursor on a capped collection or on ``local.oplog.rs``;
    ``skip`` applies to the first matches, ``limit`` ends the cursor once reached."""
    state = ctx.state
    counts = {"skip": skip, "left": limit or -1}

    def admit() -> bool:
        if counts["skip"]:
            counts["skip"] -= 1
            return False
        return counts["left"] != 0
    ns = f"{ctx.db}.{name}"
    encode = _encoder(projection)
    lost = (136, "CappedPositionLost")
    if ctx.db == "local" and name == "oplog.rs":
        oplog = state.oplog
        last: list[Timestamp] = []

        def poll_oplog(limit: int | None) -> list[bytes]:
            with state.lock:
                if last and not oplog.covers(last[0]):
                    raise command_error(lost, "CollectionScan died due to position in capped collection being deleted.")
                entries = oplog.read(last[0] if last else None, inclusive=False)
            out: list[bytes] = []
            for entry in entries:
                last[:] = [entry["ts"]]
                if (not query or matching.matches(query, entry)) and admit():
                    out.append(bson.encode(matching.project(entry, projection)))
                    counts["left"] -= 1
                    if (limit and len(out) >= limit) or counts["left"] == 0:
                        break
            return out

        return TailableFindCursor(ns, poll_oplog, await_data, lambda seconds: oplog.wait_for_entries_after(last[0] if last else None, seconds),
                                  lambda: counts["left"] == 0)  # fmt: skip
    coll = state.get_collection(ctx.db, name)
    if coll is None or not coll.options.get("capped"):
        raise command_error(BAD_VALUE, f"error processing query: ns={ns} tailable cursor requested on non capped collection")
    position: list[IdKey] = []

    def poll(limit: int | None) -> list[bytes]:
        with state.lock:
            keys = list(coll.docs)
            start = 0
            if position:
                try:
                    start = keys.index(position[0]) + 1
                except ValueError:
                    raise command_error(lost, "CollectionScan died due to position in capped collection being deleted.") from None
            stored = [coll.docs[k] for k in keys[start:]]
        out: list[bytes] = []
        for index, item in enumerate(stored):
            position[:] = [keys[start + index]]
            if (not query or matching.matches(query, item[0])) and admit():
                out.append(encode(item))
                counts["left"] -= 1
                if (limit and len(out) >= limit) or counts["left"] == 0:
                    break
        return out

    seen = state.oplog.clock.current()

    def wait(seconds: float) -> bool:
        nonlocal seen
        woke = state.oplog.wait_for_entries_after(seen, seconds)
        seen = state.oplog.clock.current()
        return woke

    return TailableFindCursor(ns, poll, await_data, wait, lambda: counts["left"] == 0)


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
        if isinstance(cursor, (TailableCursor, TailableFindCursor)):
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
    query = matching.bind_variables(ctx.get("query", Mapping) or {}, _let(ctx))
    skip = ctx.get_int("skip", 0, minimum=0) or 0
    limit = abs(ctx.get_int("limit", 0) or 0)
    collation = matching.collation_key(ctx.cmd.get("collation"))
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
            total = len(ctx.state.match_stored(coll, query, collation=collation))
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
    query = matching.bind_variables(ctx.get("query", Mapping) or {}, _let(ctx))
    matching.validate_filter(query)
    collation = matching.collation_key(ctx.cmd.get("collation"))
    coll = _docs_for_read(ctx, name)
    seen: dict[Any, Any] = {}
    if coll is not None:
        for doc in ctx.state.match(coll, query, collation=collation):
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
        return explain_reply(ctx, {k: v for k, v in ctx.cmd.items() if k != "explain"})
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
    pipeline = matching.bind_variables(pipeline, _let(ctx))
    writer = pipeline[-1] if pipeline and next(iter(pipeline[-1])) in ("$out", "$merge") else None
    if writer is not None:
        concern = ctx.cmd.get("readConcern")
        if isinstance(concern, Mapping) and concern.get("level") == "linearizable":
            raise command_error(INVALID_OPTIONS, f"{next(iter(writer))} cannot be used with a 'linearizable' read concern level")
        if ctx.txn is not None:
            raise command_error((263, "OperationNotSupportedInTransaction"),
                                f"{next(iter(writer))} cannot be used in a transaction")  # fmt: skip
        pipeline = pipeline[:-1]
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
                stored = list(coll.docs.values())
            if matching.validate_pipeline(pipeline) and next(iter(pipeline[0])) == "$sample":
                # mongod's random cursor reads only the documents it picks: so does this
                stored = matching.sample_stage(stored, pipeline[0]["$sample"])
                pipeline = pipeline[1:]
            docs = [d for d, _ in stored]
    results = matching.run_pipeline(docs, pipeline, _pipeline_resolver(ctx, ctx.txn))
    if writer is not None:
        stage_name, spec = next(iter(writer.items()))
        bypass = bool(ctx.cmd.get("bypassDocumentValidation"))
        with ctx.state.batch():
            if stage_name == "$out":
                write_out(ctx.state, ctx.db, spec, results, bypass)
            else:
                write_merge(ctx.state, ctx.db, spec, results, bypass)
        results = []
    cursor = ListCursor(ns, results, _encode_checked)
    return _cursor_reply(ctx, cursor, ns, DEFAULT_FIRST_BATCH if batch_size is None else batch_size, False, "firstBatch")


def _target(db: str, spec: Any, stage: str) -> tuple[str, str]:
    if isinstance(spec, str):
        return db, spec
    if isinstance(spec, Mapping):
        coll = spec.get("coll")
        if isinstance(coll, str) and coll:
            return str(spec.get("db", db)), coll
    raise command_error((16994, "Location16994"), f"{stage} requires a collection name or {{db, coll}}")


def write_out(state: ServerState, db: str, spec: Any, docs: list[dict[str, Any]], bypass: bool) -> None:
    """``$out`` as mongod 7.0 runs it: the results go into a temporary collection of the target
    database (with the target's options and indexes), which then replaces the target by
    ``renameCollection`` with ``dropTarget`` — so change streams see those same events."""
    target_db, target = _target(db, spec.get("into", spec) if isinstance(spec, Mapping) and "into" in spec else spec, "$out")
    check_namespace(target_db, target)
    if target_db in ("admin", "local", "config") or target.startswith("system."):
        raise command_error((73, "InvalidNamespace"), f"Invalid $out target namespace, {target_db}.{target}")
    existing = state.get_collection(target_db, target)
    options = dict(existing.options) if existing is not None else {}
    if options.get("capped"):
        raise command_error((17152, "Location17152"), f"namespace '{target_db}.{target}' is capped so it can't be used for $out")
    temp = f"tmp.agg_out.{uuid.uuid4()}"
    state.create_collection(target_db, temp, options)
    try:
        if existing is not None:
            specs = [dict(ix.spec) for name, ix in existing.indexes.items() if name != "_id_"]
            if specs:
                state.create_indexes(target_db, temp, specs)
        for doc in docs:
            state.insert_one(target_db, temp, dict(doc), None, bypass)
    except CommandError:
        state.drop_collection(target_db, temp)
        raise
    state.rename_collection(f"{target_db}.{temp}", f"{target_db}.{target}", drop_target=True)


_WHEN_MATCHED = ("merge", "replace", "keepExisting", "fail")
_WHEN_NOT_MATCHED = ("insert", "discard", "fail")


def write_merge(state: ServerState, db: str, spec: Any, docs: list[dict[str, Any]], bypass: bool) -> None:
    """``$merge``: each result is matched to the target by ``on`` (``_id`` by default) and then
    merged, replaced, kept, refused (DuplicateKey), or run through a pipeline (``$$new``)."""
    if isinstance(spec, (str, Mapping)) and not (isinstance(spec, Mapping) and "into" not in spec):
        options: Mapping[str, Any] = {"into": spec} if isinstance(spec, str) else spec
    else:
        raise command_error((40414, "Location40414"), "BSON field '$merge.into' is missing but a required field")
    target_db, target = _target(db, options["into"], "$merge")
    check_namespace(target_db, target)
    on = options.get("on", "_id")
    fields = [on] if isinstance(on, str) else list(on)
    when_matched = options.get("whenMatched", "merge")
    when_not_matched = options.get("whenNotMatched", "insert")
    if not isinstance(when_matched, list) and when_matched not in _WHEN_MATCHED:
        raise command_error(BAD_VALUE, f"Enumeration value '{when_matched}' for field 'whenMatched' is not a valid value.")
    if when_not_matched not in _WHEN_NOT_MATCHED:
        raise command_error(BAD_VALUE, f"Enumeration value '{when_not_matched}' for field 'whenNotMatched' is not a valid value.")
    coll = state.get_collection(target_db, target)
    if fields != ["_id"] and (coll is None or not any(
        ix.unique and set(ix.spec["key"]) == set(fields) for ix in coll.indexes.values()
    )):  # fmt: skip
        raise command_error((51183, "Location51183"), "Cannot find index to verify that join fields will be unique")
    variables = dict(options.get("let") or {"new": "$$ROOT"})
    for doc in docs:
        doc = dict(doc)
        if fields == ["_id"] and "_id" not in doc:
            doc = {"_id": ObjectId(), **doc}
        condition = {f: None if (v := matching.get_path(doc, f)) is matching._MISSING else v for f in fields}
        coll = state.get_collection(target_db, target)
        found = state.match(coll, condition, limit=1) if coll is not None else []
        if not found:
            if when_not_matched == "insert":
                state.insert_one(target_db, target, doc, None, bypass)
            elif when_not_matched == "fail":
                raise command_error((13113, "MergeStageNoMatchingDocument"), "$merge could not find a matching document in the target collection for at least one document in the source collection")
            continue
        key = {"_id": found[0]["_id"]}
        if when_matched == "keepExisting":
            continue
        if when_matched == "fail":
            values = {f: condition[f] for f in fields}
            pattern = {f: 1 for f in fields}
            raise DuplicateKeyError(
                f"E11000 duplicate key error collection: {target_db}.{target} index: {'_id_' if fields == ['_id'] else '_'.join(f + '_1' for f in fields)} dup key: {format_value(values)}",
                pattern, values,
            )  # fmt: skip
        if when_matched == "replace":
            update: Any = {k: v for k, v in doc.items() if k != "_id"}
        elif when_matched == "merge":
            update = {"$set": {k: v for k, v in doc.items() if k != "_id"}} if len(doc) > 1 else {"$set": {}}
            if not update["$set"]:
                continue
        else:
            bound = {name: (doc if value == "$$ROOT" else matching.evaluate_constant(matching.bind_variables(value, {"new": doc})))
                     for name, value in variables.items()}  # fmt: skip
            update = matching.bind_variables(list(when_matched), bound)
        state.update_documents(target_db, target, key, update, multi=False, upsert=False, array_filters=None, txn=None,
                               bypass_validation=bypass)  # fmt: skip


def _encode_checked(doc: dict[str, Any]) -> bytes:
    raw = bson.encode(doc)
    if len(raw) > 16 * 1024 * 1024:
        raise command_error((10334, "BSONObjectTooLarge"), f"BSONObj size: {len(raw)} (0x{len(raw):X}) is invalid. Size must be between 0 and 16793600(16MB)")
    return raw


# --------------------------------------------------------------------------------------------
# explain
# --------------------------------------------------------------------------------------------
_EXPLAINABLE = ("find", "aggregate", "count", "distinct", "update", "delete", "findAndModify", "findandmodify")


@command("explain", primary=True)
def explain(ctx: Context) -> dict[str, Any]:
    inner = ctx.arg
    if not isinstance(inner, Mapping) or not inner:
        raise command_error(FAILED_TO_PARSE, "explain command requires a nested object")
    verbosity = ctx.cmd.get("verbosity", "allPlansExecution")
    if verbosity not in ("queryPlanner", "executionStats", "allPlansExecution"):
        raise command_error(BAD_VALUE, f"Enumeration value '{verbosity}' for field 'explain.verbosity' is not a valid value.")
    return explain_reply(ctx, dict(inner))


def explain_reply(ctx: Context, inner: dict[str, Any]) -> dict[str, Any]:
    """A plan in mongod's explain shape: a collection scan, or an index scan when a hint names an
    index; write commands are explained without being run. Statistics count the matches."""
    name = next(iter(inner))
    if name not in _EXPLAINABLE:
        raise command_error(ILLEGAL_OPERATION, f"Explain failed due to unknown command: {name}")
    target = inner[name]
    if not isinstance(target, str):
        raise command_error((73, "InvalidNamespace"), f"Invalid namespace for explain of {name}")
    check_namespace(ctx.db, target)
    if name == "find":
        query, hint = inner.get("filter") or {}, inner.get("hint")
    elif name in ("count", "distinct"):
        query, hint = inner.get("query") or {}, inner.get("hint")
    elif name == "update":
        statement = (inner.get("updates") or [{}])[0]
        query, hint = statement.get("q") or {}, statement.get("hint")
    elif name == "delete":
        statement = (inner.get("deletes") or [{}])[0]
        query, hint = statement.get("q") or {}, statement.get("hint")
    elif name == "aggregate":
        stages = inner.get("pipeline") or []
        first = stages[0] if stages and isinstance(stages[0], Mapping) else {}
        query, hint = first.get("$match", {}), inner.get("hint")
    else:
        query, hint = inner.get("query") or {}, inner.get("hint")
    matching.validate_filter(query)
    _check_hint(ctx, target, hint)
    coll = ctx.state.get_collection(ctx.db, target, ctx.txn)
    index = _hinted_index(coll, hint) if coll is not None else None
    examined = len(coll.docs) if coll is not None else 0
    returned = len(ctx.state.match_stored(coll, query)) if coll is not None else 0
    if index is not None:
        plan: dict[str, Any] = {"stage": "FETCH", "inputStage": {
            "stage": "IXSCAN", "keyPattern": dict(index.spec["key"]), "indexName": index.name,
            "isMultiKey": False, "isUnique": index.unique, "isSparse": bool(index.spec.get("sparse")),
            "isPartial": "partialFilterExpression" in index.spec, "direction": "forward"}}  # fmt: skip
    else:
        plan = {"stage": "COLLSCAN", "filter": dict(query), "direction": "forward"}
    from .admin import VERSION

    return {
        "explainVersion": "1",
        "queryPlanner": {"namespace": f"{ctx.db}.{target}", "indexFilterSet": False, "parsedQuery": dict(query),
                         "winningPlan": plan, "rejectedPlans": []},  # fmt: skip
        "executionStats": {"executionSuccess": True, "nReturned": returned, "executionTimeMillis": 0,
                           "totalKeysExamined": returned if index is not None else 0,
                           "totalDocsExamined": examined, "executionStages": plan},  # fmt: skip
        "command": {**inner, "$db": ctx.db},
        "serverInfo": {"host": ctx.server.config.host, "port": ctx.server.config.port, "version": VERSION,
                       "gitVersion": "mongocdc-emulator"},  # fmt: skip
    }
