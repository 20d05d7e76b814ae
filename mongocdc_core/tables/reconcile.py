"""Does ``current_state`` equal the MongoDB collections? Counts plus an order-independent hash.

Each document, on either side, is hashed as BLAKE2b-64 of its canonical Extended JSON with sorted
keys (``documents.document_hash``); a collection's fingerprint is the count and the sum of those
hashes modulo 2**64. Only when fingerprints differ are per-key hashes compared, to name the first
mismatching keys. Field transforms (``field.exclude.list``, ``field.renames``) make the table differ
from the source on purpose; reconcile collections captured without them.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pymongo import MongoClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mongocdc_core.tables import documents
from mongocdc_core.tables.current_state import read_current_state

_MASK64 = (1 << 64) - 1
_HASH_SCHEMA = T.StructType(
    [T.StructField("id", T.StringType()), T.StructField("hi", T.LongType()), T.StructField("lo", T.LongType())]
)
MAX_REPORTED_KEYS = 20


@dataclass(frozen=True)
class CollectionReconciliation:
    """One collection's comparison; ``mismatching_keys`` are canonical Extended JSON ``_id`` values."""

    namespace: str
    table_count: int
    source_count: int
    table_hash: int
    source_hash: int
    mismatching_keys: tuple[str, ...] = ()

    @property
    def matches(self) -> bool:
        return self.table_count == self.source_count and self.table_hash == self.source_hash


@dataclass(frozen=True)
class ReconcileResult:
    """All compared collections; ``mismatching_keys`` are ``<namespace> <_id>`` strings."""

    collections: tuple[CollectionReconciliation, ...] = field(default_factory=tuple)

    @property
    def matches(self) -> bool:
        return all(c.matches for c in self.collections)

    @property
    def table_count(self) -> int:
        return sum(c.table_count for c in self.collections)

    @property
    def source_count(self) -> int:
        return sum(c.source_count for c in self.collections)

    @property
    def mismatching_keys(self) -> list[str]:
        return [f"{c.namespace} {k}" for c in self.collections for k in c.mismatching_keys]


def _hash_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``document`` -> (canonical ``_id``, high and low 32 bits of the document hash)."""
    for batch in batches:
        ids: list[str] = []
        his: list[int] = []
        los: list[int] = []
        for text in batch.column("document").to_pylist():
            doc = documents.loads(text)
            h = documents.document_hash(doc)
            ids.append(documents.canonical_json(doc.get("_id")))
            his.append(h >> 32)
            los.append(h & 0xFFFFFFFF)
        yield pa.RecordBatch.from_pydict({"id": ids, "hi": his, "lo": los}, schema=pa.schema(
            [("id", pa.string()), ("hi", pa.int64()), ("lo", pa.int64())]
        ))


def _table_hashes(state: DataFrame, namespace: str) -> DataFrame:
    return state.where(F.col("collection") == namespace).select("document").mapInArrow(_hash_rows, _HASH_SCHEMA)


def _combine(hi_sum: int, lo_sum: int) -> int:
    return ((hi_sum << 32) + lo_sum) & _MASK64


def _source_hashes(client: MongoClient, namespace: str) -> dict[str, int]:
    db, _, coll = namespace.partition(".")
    if not db or not coll:
        raise ValueError(f"not a '<db>.<collection>' namespace: {namespace!r}")
    return {
        documents.canonical_json(doc.get("_id")): documents.document_hash(doc)
        for doc in client[db][coll].find({})
    }


def _differences(table: dict[str, int], source: dict[str, int], table_dupes: list[str]) -> tuple[str, ...]:
    keys = set(table_dupes)
    keys.update(k for k in table.keys() | source.keys() if table.get(k) != source.get(k))
    return tuple(sorted(keys)[:MAX_REPORTED_KEYS])


def reconcile_collection(
    spark: SparkSession, state: DataFrame, client: MongoClient, namespace: str
) -> CollectionReconciliation:
    """Compare one collection's rows of ``state`` with the live collection."""
    hashed = _table_hashes(state, namespace).cache()
    try:
        agg = hashed.agg(F.count("*").alias("n"), F.sum("hi").alias("hi"), F.sum("lo").alias("lo")).first()
        assert agg is not None
        table_count, table_hash = int(agg["n"]), _combine(int(agg["hi"] or 0), int(agg["lo"] or 0))
        source = _source_hashes(client, namespace)
        source_hash = sum(source.values()) & _MASK64
        keys: tuple[str, ...] = ()
        if table_count != len(source) or table_hash != source_hash:
            table: dict[str, int] = {}
            dupes: list[str] = []
            for row in hashed.collect():
                if row["id"] in table:
                    dupes.append(row["id"])
                table[row["id"]] = _combine(row["hi"], row["lo"])
            keys = _differences(table, source, dupes)
    finally:
        hashed.unpersist()
    return CollectionReconciliation(namespace, table_count, len(source), table_hash, source_hash, keys)


def reconcile(
    spark: SparkSession,
    state_location: str,
    client: MongoClient,
    namespaces: Sequence[str],
) -> ReconcileResult:
    """Compare current_state with MongoDB for each ``<db>.<collection>`` in ``namespaces``.

    The caller owns ``client`` (this module opens no connection of its own)."""
    state = read_current_state(spark, state_location)
    return ReconcileResult(tuple(reconcile_collection(spark, state, client, ns) for ns in namespaces))
