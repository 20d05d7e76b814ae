"""Kafka Connect schemas as JsonConverter writes them, and Avro name adjustment.

Schemas are plain dicts whose key order is JsonConverter's (``type``, ``fields``/``items``,
``optional``, ``default``, ``name``, ``version``, ``parameters``, ``field``), so their orjson bytes
equal what a Debezium connector with ``schemas.enable=true`` puts on the wire. They are built once
per topic and cached as bytes by the converter.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

JSON_SCHEMA_NAME = "io.debezium.data.Json"
ENUM_SCHEMA_NAME = "io.debezium.data.Enum"
SOURCE_SCHEMA_NAME = "io.debezium.connector.mongo.Source"
UPDATE_DESCRIPTION_SCHEMA_NAME = "io.debezium.connector.mongodb.changestream.updatedescription"
TRUNCATED_ARRAY_SCHEMA_NAME = "io.debezium.connector.mongodb.changestream.truncatedarray"
TRANSACTION_BLOCK_SCHEMA_NAME = "event.block"
TRANSACTION_KEY_SCHEMA_NAME = "io.debezium.connector.common.TransactionMetadataKey"
TRANSACTION_VALUE_SCHEMA_NAME = "io.debezium.connector.common.TransactionMetadataValue"
TRANSACTION_COLLECTION_SCHEMA_NAME = "event.collection"
HEARTBEAT_KEY_SCHEMA_NAME = "io.debezium.connector.common.ServerNameKey"
HEARTBEAT_VALUE_SCHEMA_NAME = "io.debezium.connector.common.Heartbeat"
SNAPSHOT_VALUES = (
    "true",
    "first",
    "first_in_data_collection",
    "last_in_data_collection",
    "last",
    "false",
    "incremental",
)

_MISSING: Any = object()


def _schema(
    type_: str,
    optional: bool,
    *,
    fields: list[dict[str, Any]] | None = None,
    items: dict[str, Any] | None = None,
    default: Any = _MISSING,
    name: str | None = None,
    version: int | None = None,
    parameters: dict[str, str] | None = None,
    default_last: bool = False,
) -> dict[str, Any]:
    """A Kafka Connect schema in JsonConverter's key order; the documented (2.x) records put ``default``
    after ``optional``, Debezium 3.x's after everything (``default_last``)."""
    out: dict[str, Any] = {"type": type_}
    if fields is not None:
        out["fields"] = fields
    if items is not None:
        out["items"] = items
    out["optional"] = optional
    if default is not _MISSING and not default_last:
        out["default"] = default
    if name is not None:
        out["name"] = name
    if version is not None:
        out["version"] = version
    if parameters is not None:
        out["parameters"] = parameters
    if default is not _MISSING and default_last:
        out["default"] = default
    return out


def _field(field_name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "field": field_name}


def _json_field(field_name: str) -> dict[str, Any]:
    return _field(field_name, _schema("string", True, name=JSON_SCHEMA_NAME, version=1))


def _plain(field_name: str, type_: str, optional: bool) -> dict[str, Any]:
    return _field(field_name, _schema(type_, optional))


def source_schema() -> dict[str, Any]:
    """``io.debezium.connector.mongo.Source`` of the change streams format."""
    snapshot = _schema(
        "string",
        True,
        default="false",
        name=ENUM_SCHEMA_NAME,
        version=1,
        parameters={"allowed": ",".join(SNAPSHOT_VALUES)},
    )
    return _schema(
        "struct",
        False,
        fields=[
            _plain("version", "string", False),
            _plain("connector", "string", False),
            _plain("name", "string", False),
            _plain("ts_ms", "int64", False),
            _plain("ts_us", "int64", False),
            _plain("ts_ns", "int64", False),
            _field("snapshot", snapshot),
            _plain("db", "string", False),
            _plain("rs", "string", False),
            _plain("collection", "string", False),
            _plain("ord", "int32", False),
            _plain("h", "int64", True),
            _plain("tord", "int64", True),
            _plain("stxnid", "string", True),
            _plain("lsid", "string", True),
            _plain("txnNumber", "int64", True),
            _plain("wallTime", "int64", True),
        ],
        name=SOURCE_SCHEMA_NAME,
    )


def source_schema_1x() -> dict[str, Any]:
    """The 1.x (oplog era) source block: boolean ``snapshot``, ``h`` and ``stxnid``."""
    return _schema(
        "struct",
        False,
        fields=[
            _plain("version", "string", False),
            _plain("connector", "string", False),
            _plain("name", "string", False),
            _plain("ts_ms", "int64", False),
            _field("snapshot", _schema("boolean", True, default=False)),
            _plain("db", "string", False),
            _plain("rs", "string", False),
            _plain("collection", "string", False),
            _plain("ord", "int32", False),
            _plain("h", "int64", True),
            _plain("stxnid", "string", True),
        ],
        name=SOURCE_SCHEMA_NAME,
    )


def transaction_block_schema() -> dict[str, Any]:
    """The optional ``transaction`` field of every envelope."""
    return _schema(
        "struct",
        True,
        fields=[
            _plain("id", "string", False),
            _plain("total_order", "int64", False),
            _plain("data_collection_order", "int64", False),
        ],
        name=TRANSACTION_BLOCK_SCHEMA_NAME,
        version=1,
    )


def envelope_schema(name: str) -> dict[str, Any]:
    """Value schema of a collection's topic in the change streams format."""
    truncated = _schema(
        "struct",
        False,
        fields=[_plain("field", "string", False), _plain("size", "int32", False)],
        name=TRUNCATED_ARRAY_SCHEMA_NAME,
        version=1,
    )
    update_description = _schema(
        "struct",
        True,
        fields=[
            _field("removedFields", _schema("array", True, items=_schema("string", False))),
            _json_field("updatedFields"),
            _field("truncatedArrays", _schema("array", True, items=truncated)),
        ],
        name=UPDATE_DESCRIPTION_SCHEMA_NAME,
        version=1,
    )
    return _schema(
        "struct",
        False,
        fields=[
            _json_field("before"),
            _json_field("after"),
            _field("updateDescription", update_description),
            _field("source", source_schema()),
            _plain("op", "string", True),
            _plain("ts_ms", "int64", True),
            _plain("ts_us", "int64", True),
            _plain("ts_ns", "int64", True),
            _field("transaction", transaction_block_schema()),
        ],
        name=name,
    )


def envelope_schema_1x(name: str) -> dict[str, Any]:
    """Value schema of a collection's topic in the 1.x format (``after``/``patch``/``filter``)."""
    return _schema(
        "struct",
        False,
        fields=[
            _json_field("after"),
            _json_field("patch"),
            _json_field("filter"),
            _field("source", source_schema_1x()),
            _plain("op", "string", True),
            _plain("ts_ms", "int64", True),
            _field("transaction", transaction_block_schema()),
        ],
        name=name,
    )


def key_schema(name: str) -> dict[str, Any]:
    """Key schema of a collection's topic: one required string ``id``."""
    return _schema("struct", False, fields=[_plain("id", "string", False)], name=name)


def transaction_key_schema() -> dict[str, Any]:
    return _schema("struct", False, fields=[_plain("id", "string", False)], name=TRANSACTION_KEY_SCHEMA_NAME)


def transaction_value_schema() -> dict[str, Any]:
    collection = _schema(
        "struct",
        False,
        fields=[_plain("data_collection", "string", False), _plain("event_count", "int64", False)],
        name=TRANSACTION_COLLECTION_SCHEMA_NAME,
    )
    return _schema(
        "struct",
        False,
        fields=[
            _plain("status", "string", False),
            _plain("id", "string", False),
            _plain("event_count", "int64", True),
            _field("data_collections", _schema("array", True, items=collection)),
            _plain("ts_ms", "int64", False),
        ],
        name=TRANSACTION_VALUE_SCHEMA_NAME,
    )


def heartbeat_key_schema() -> dict[str, Any]:
    return _schema(
        "struct", False, fields=[_plain("serverName", "string", False)], name=HEARTBEAT_KEY_SCHEMA_NAME
    )


def heartbeat_value_schema() -> dict[str, Any]:
    return _schema(
        "struct", False, fields=[_plain("ts_ms", "int64", False)], name=HEARTBEAT_VALUE_SCHEMA_NAME
    )


class Serializer:
    """Writes payloads as JsonConverter does, with or without the ``schema`` part.

    The schema bytes are passed in already serialized (cached per topic by the caller), so one
    record costs one orjson call plus two byte concatenations.
    """

    __slots__ = ("schemas_enable",)

    def __init__(self, schemas_enable: bool) -> None:
        self.schemas_enable = schemas_enable

    @staticmethod
    def schema_prefix(schema: dict[str, Any]) -> bytes:
        """``{"schema":<schema>,"payload":`` — the constant head of every record on a topic."""
        return b'{"schema":' + orjson.dumps(schema) + b',"payload":'

    def dumps(self, prefix: bytes, payload: Any) -> bytes:
        if self.schemas_enable:
            return prefix + orjson.dumps(payload) + b"}"
        return orjson.dumps(payload)


_AVRO_FIRST = re.compile(r"[A-Za-z_]")
_AVRO_REST = re.compile(r"[A-Za-z0-9_]")


def _adjust_part(part: str, mode: str) -> str:
    if mode == "none" or not part:
        return part
    out = []
    for i, ch in enumerate(part):
        valid = (_AVRO_FIRST if i == 0 else _AVRO_REST).fullmatch(ch) is not None
        if mode == "avro_unicode" and (ch == "_" or not valid):
            out.append(f"_u{ord(ch):04x}")
        elif mode == "avro" and not valid:
            out.append("_")
        else:
            out.append(ch)
    return "".join(out)


def adjust_schema_name(name: str, mode: str) -> str:
    """Apply ``schema.name.adjustment.mode`` to a full schema name; dots separate namespaces."""
    if mode == "none":
        return name
    return ".".join(_adjust_part(part, mode) for part in name.split("."))


def adjust_field_name(name: str, mode: str) -> str:
    """Apply ``field.name.adjustment.mode`` to one field name (dots are invalid in Avro names)."""
    return _adjust_part(name, mode)
