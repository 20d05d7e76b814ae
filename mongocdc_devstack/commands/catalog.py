"""Catalog commands: databases, collections, indexes, create/collMod/drop/rename, stats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson import Int64
from bson.binary import Binary

from .. import matching
from ..cursors import ListCursor
from ..errors import (
    BAD_VALUE,
    FAILED_TO_PARSE,
    INVALID_OPTIONS,
    NAMESPACE_NOT_FOUND,
    TYPE_MISMATCH,
    command_error,
)
from ..state import ID_INDEX, SYSTEM_DATABASES, Collection, check_namespace
from . import Context, command
from .crud import _cursor_reply, _encode_checked

# Command fields that are envelope, not collection options.
_GENERIC_FIELDS = frozenset({"$db", "lsid", "$clusterTime", "$readPreference", "writeConcern", "comment", "txnNumber",
                             "autocommit", "startTransaction", "readConcern", "maxTimeMS", "apiVersion", "apiStrict",
                             "apiDeprecationErrors"})  # fmt: skip
_CREATE_OPTIONS = frozenset({"capped", "size", "max", "changeStreamPreAndPostImages", "validator", "validationLevel",
                             "validationAction", "collation", "storageEngine", "indexOptionDefaults", "viewOn",
                             "pipeline", "timeseries", "expireAfterSeconds", "clusteredIndex", "autoIndexId",
                             "encryptedFields", "idIndex"})  # fmt: skip


def _collection_info(coll: Collection) -> dict[str, Any]:
    return {
        "name": coll.name,
        "type": "collection",
        "options": dict(coll.options),
        "info": {"readOnly": False, "uuid": Binary.from_uuid(coll.uuid)},
        "idIndex": dict(ID_INDEX),
    }


def _oplog_info(ctx: Context) -> dict[str, Any]:
    return {
        "name": "oplog.rs",
        "type": "collection",
        "options": {"capped": True, "size": Int64(ctx.state.oplog.max_bytes), "autoIndexId": False},
        "info": {"readOnly": False},
    }


@command("listDatabases", admin_only=True)
def list_databases(ctx: Context) -> dict[str, Any]:
    names = set(ctx.state.database_names()) | set(SYSTEM_DATABASES)
    query = ctx.get("filter", Mapping)
    if ctx.cmd.get("nameOnly") and (not query or set(query) <= {"name"}):
        # As mongod: names only, and no size computed unless the filter asks about one (a size
        # walks every document of the database).
        names_only = [{"name": name} for name in sorted(names)]
        return {"databases": matching.filter_documents(names_only, query) if query else names_only}
    entries = []
    total = 0
    for name in sorted(names):
        with ctx.state.lock:
            size = sum(len(raw) for coll in ctx.state.collections(name) for _, raw in coll.docs.values())
        if name == "local":
            size += ctx.state.oplog.size_bytes()
        total += size
        entries.append({"name": name, "sizeOnDisk": Int64(size or 4096), "empty": False})
    if query:
        entries = matching.filter_documents(entries, query)
    if ctx.cmd.get("nameOnly"):
        return {"databases": [{"name": e["name"]} for e in entries]}
    return {"databases": entries, "totalSize": Int64(total), "totalSizeMb": Int64(total // (1024 * 1024))}


@command("listCollections", primary=True)
def list_collections(ctx: Context) -> dict[str, Any]:
    check_namespace(ctx.db)
    infos = [_collection_info(coll) for coll in ctx.state.collections(ctx.db)]
    if ctx.db == "local":
        infos.append(_oplog_info(ctx))
    query = ctx.get("filter", Mapping)
    if query:
        infos = matching.filter_documents(infos, query)
    if ctx.cmd.get("nameOnly"):
        infos = [{"name": info["name"], "type": info["type"]} for info in infos]
    cursor_opts = ctx.get("cursor", Mapping) or {}
    ns = f"{ctx.db}.$cmd.listCollections"
    return _cursor_reply(ctx, ListCursor(ns, infos, _encode_checked), ns, cursor_opts.get("batchSize"), False, "firstBatch")


@command("listIndexes", primary=True, in_transaction=True)
def list_indexes(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    coll = ctx.state.get_collection(ctx.db, name)
    if coll is None:
        raise command_error(NAMESPACE_NOT_FOUND, f"ns does not exist: {ctx.db}.{name}")
    with ctx.state.lock:
        specs = [dict(ix.spec) for ix in coll.indexes.values()]
    cursor_opts = ctx.get("cursor", Mapping) or {}
    ns = f"{ctx.db}.{name}"
    return _cursor_reply(ctx, ListCursor(ns, specs, _encode_checked), ns, cursor_opts.get("batchSize"), False, "firstBatch")


def _index_spec(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise command_error(TYPE_MISMATCH, "index specification must be an object")
    key = raw.get("key")
    if not isinstance(key, Mapping) or not key:
        raise command_error(FAILED_TO_PARSE, "Index keys cannot be empty." if isinstance(key, Mapping)
                            else "The 'key' field is a required property of an index specification")  # fmt: skip
    for field, direction in key.items():
        valid = (isinstance(direction, (int, float)) and not isinstance(direction, bool) and direction != 0) or \
            direction in ("text", "2d", "2dsphere", "hashed", "geoHaystack")  # fmt: skip
        if not valid:
            raise command_error((67, "CannotCreateIndex"), f"Values in the index key pattern can't be 0 or empty strings: {field}: {direction!r}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise command_error(FAILED_TO_PARSE, "The 'name' field is a required property of an index specification")
    spec: dict[str, Any] = {"v": 2, "key": dict(key), "name": name}
    for option, value in raw.items():
        if option not in ("key", "name", "v", "ns"):
            spec[option] = value
    if spec.get("unique") is False:
        del spec["unique"]
    partial = spec.get("partialFilterExpression")
    if partial is not None:
        if not isinstance(partial, Mapping):
            raise command_error((67, "CannotCreateIndex"), "Error in specification :: caused by :: The field 'partialFilterExpression' must be an object")
        matching.validate_filter(partial)
    text = [field for field, direction in key.items() if direction == "text"]
    if text:
        # mongod stores a text index under its internal key, with its weights and language fields.
        rest = {field: direction for field, direction in key.items() if direction != "text"}
        spec["key"] = {"_fts": "text", "_ftsx": 1, **rest}
        spec.setdefault("weights", {field: 1 for field in text})
        spec.setdefault("default_language", "english")
        spec.setdefault("language_override", "language")
        spec.setdefault("textIndexVersion", 3)
    return spec


@command("createIndexes", primary=True, in_transaction=True)
def create_indexes(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    check_namespace(ctx.db, name)
    raw_specs = ctx.cmd.get("indexes")
    if not isinstance(raw_specs, list) or not raw_specs:
        raise command_error(BAD_VALUE, "Must specify at least one index to create")
    specs = [_index_spec(raw) for raw in raw_specs]
    before, after, created = ctx.state.create_indexes(ctx.db, name, specs, ctx.txn)
    reply: dict[str, Any] = {"numIndexesBefore": before, "numIndexesAfter": after, "createdCollectionAutomatically": created}
    if before == after:
        reply["note"] = "all indexes already exist"
    return reply


@command("dropIndexes", "deleteIndexes", primary=True)
def drop_indexes(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    if "index" not in ctx.cmd:
        raise command_error(FAILED_TO_PARSE, "BSON field 'dropIndexes.index' is missing but a required field")
    return {"nIndexesWas": ctx.state.drop_indexes(ctx.db, name, ctx.cmd["index"])}


def _options(ctx: Context, allowed: frozenset[str]) -> dict[str, Any]:
    options = {}
    for key, value in ctx.cmd.items():
        if key == ctx.name or key in _GENERIC_FIELDS:
            continue
        if key not in allowed:
            raise command_error((40415, "Location40415"), f"BSON field '{ctx.name}.{key}' is an unknown field.")
        options[key] = value
    return options


def _check_images_option(options: Mapping[str, Any]) -> None:
    setting = options.get("changeStreamPreAndPostImages")
    if setting is not None and (not isinstance(setting, Mapping) or not isinstance(setting.get("enabled"), bool)):
        raise command_error(FAILED_TO_PARSE, "BSON field 'changeStreamPreAndPostImages.enabled' is missing but a required field")


@command("create", primary=True, in_transaction=True)
def create(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    options = _options(ctx, _CREATE_OPTIONS)
    _check_images_option(options)
    if options.get("capped"):
        size = options.get("size")
        if not isinstance(size, (int, float)) or isinstance(size, bool) or size <= 0:
            raise command_error(INVALID_OPTIONS, "the 'size' field is required when 'capped' is true")
    elif "size" in options or "max" in options:
        raise command_error(INVALID_OPTIONS, "the 'size' field is only valid for capped collections" if "size" in options
                            else "the 'max' field is only valid for capped collections")  # fmt: skip
    if "viewOn" in options or "timeseries" in options:
        raise command_error(matching.NOT_IMPLEMENTED, "views and time series collections are not supported by the emulator")
    options.pop("idIndex", None)
    ctx.state.create_collection(ctx.db, name, options, txn=ctx.txn)
    return {}


@command("collMod", primary=True)
def coll_mod(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    changes = _options(ctx, frozenset({"changeStreamPreAndPostImages", "validator", "validationLevel", "validationAction",
                                       "index", "expireAfterSeconds", "cappedSize", "cappedMax"}))  # fmt: skip
    _check_images_option(changes)
    if "index" in changes:
        raise command_error(matching.NOT_IMPLEMENTED, "collMod of an index is not supported by the emulator")
    ctx.state.coll_mod(ctx.db, name, changes)
    return {}


@command("drop", primary=True)
def drop(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    check_namespace(ctx.db, name)
    indexes = ctx.state.drop_collection(ctx.db, name)
    if indexes is None:
        return {}
    return {"nIndexesWas": indexes, "ns": f"{ctx.db}.{name}"}


@command("dropDatabase", primary=True)
def drop_database(ctx: Context) -> dict[str, Any]:
    if ctx.arg != 1:
        raise command_error(BAD_VALUE, "have to pass 1 as db parameter")
    check_namespace(ctx.db)
    if ctx.db in ("admin", "local", "config"):
        raise command_error((20, "IllegalOperation"), f"Dropping the '{ctx.db}' database is prohibited.")
    ctx.state.drop_database(ctx.db)
    return {}


@command("renameCollection", primary=True, admin_only=True)
def rename_collection(ctx: Context) -> dict[str, Any]:
    source = ctx.arg
    target = ctx.cmd.get("to")
    if not isinstance(source, str) or not isinstance(target, str) or "." not in source or "." not in target:
        raise command_error((73, "InvalidNamespace"), f"Invalid source namespace: {source}" if not isinstance(source, str) or "." not in source
                            else f"Invalid target namespace: {target}")  # fmt: skip
    ctx.state.rename_collection(source, target, bool(ctx.cmd.get("dropTarget", False)), bool(ctx.cmd.get("stayTemp", False)))
    return {}


@command("dbStats", "dbstats")
def db_stats(ctx: Context) -> dict[str, Any]:
    with ctx.state.lock:
        colls = ctx.state.collections(ctx.db)
        objects = sum(len(c.docs) for c in colls)
        size = sum(len(raw) for c in colls for _, raw in c.docs.values())
    return {
        "db": ctx.db,
        "collections": len(colls),
        "views": 0,
        "objects": Int64(objects),
        "avgObjSize": float(size / objects) if objects else 0.0,
        "dataSize": float(size),
        "storageSize": float(size),
        "indexes": sum(len(c.indexes) for c in colls),
        "scaleFactor": 1,
    }


@command("collStats", "collstats", primary=True)
def coll_stats(ctx: Context) -> dict[str, Any]:
    name = ctx.collection_name()
    coll = ctx.state.get_collection(ctx.db, name)
    if coll is None:
        raise command_error(NAMESPACE_NOT_FOUND, f"Collection [{ctx.db}.{name}] not found.")
    with ctx.state.lock:
        size = sum(len(raw) for _, raw in coll.docs.values())
    return {
        "ns": coll.ns,
        "count": len(coll.docs),
        "size": size,
        "avgObjSize": size // len(coll.docs) if coll.docs else 0,
        "storageSize": size,
        "nindexes": len(coll.indexes),
        "capped": bool(coll.options.get("capped")),
    }


@command("validate", primary=True)
def validate(ctx: Context) -> dict[str, Any]:
    """Structural validation: the emulator's data structures are consistent by construction."""
    name = ctx.collection_name()
    coll = ctx.state.get_collection(ctx.db, name)
    if coll is None:
        raise command_error(NAMESPACE_NOT_FOUND, f"Collection '{ctx.db}.{name}' does not exist to validate.")
    with ctx.state.lock:
        count = len(coll.docs)
        names = list(coll.indexes)
    return {
        "ns": coll.ns,
        "uuid": Binary.from_uuid(coll.uuid),
        "nInvalidDocuments": 0,
        "nNonCompliantDocuments": 0,
        "nrecords": count,
        "nIndexes": len(names),
        "keysPerIndex": {index: count for index in names},
        "indexDetails": {index: {"valid": True} for index in names},
        "valid": True,
        "repaired": False,
        "warnings": [],
        "errors": [],
        "extraIndexEntries": [],
        "missingIndexEntries": [],
        "corruptRecords": [],
    }
