"""Per-collection tables: the API the Dagster table assets call (contracts/tables-dagster.md).

TEMPORARY ADAPTER (dagster branch): the names and signatures of the contract, implemented thinly over
the combined-table functions (one collection's rows per table location, rebuilt on each refresh) so
the Dagster assets and their tests run until the tables branch, which implements them for real, is
merged. At merge the tables branch's version of this file wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from bson import Timestamp, json_util
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.parquet import landing_row
from mongocdc_core.source.connection import open_client
from mongocdc_core.tables import documents
from mongocdc_core.tables.changelog import changed_files, read_changelog, table_exists, write_changelog
from mongocdc_core.tables.current_state import merge_current_state, read_current_state
from mongocdc_core.tables.reconcile import MAX_REPORTED_KEYS, _combine, _source_hashes, _table_hashes

__all__ = [
    "ChangelogRefresh",
    "CollectionTables",
    "Reconciliation",
    "StateRefresh",
    "TableOptions",
    "maintain",
    "reconcile_at_position",
    "refresh_changelog",
    "refresh_current_state",
]


@dataclass(frozen=True)
class CollectionTables:
    namespace: str
    changelog: str
    current_state: str

    @classmethod
    def under(cls, root: str, namespace: str, *, changelog_name: str | None = None,
              current_state_name: str | None = None) -> CollectionTables:
        db, _, coll = namespace.partition(".")
        base = root.rstrip("/")
        return cls(namespace, f"{base}/{changelog_name or f'{db}__{coll}__changelog'}",
                   f"{base}/{current_state_name or f'{db}__{coll}__current'}")


@dataclass(frozen=True)
class TableOptions:
    delete_handling: Literal["drop", "rewrite"] = "drop"
    add_fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChangelogRefresh:
    namespace: str
    files_read: int
    rows_added: int
    counts: dict[str, int]
    row_count: int
    position: str | None
    schema: StructType


@dataclass(frozen=True)
class StateRefresh:
    namespace: str
    keys_merged: int
    upserted: int
    deleted: int
    row_count: int
    position: str | None
    schema: StructType
    schema_changes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Reconciliation:
    namespace: str
    matches: bool
    position: str | None
    method: str
    table_rows: int
    source_rows: int
    keys_excluded: int
    mismatching_keys: list[str]


def _max_position(spark: SparkSession, location: str, namespace: str) -> str | None:
    table = read_changelog(spark, location).where(F.col("collection") == namespace)
    row = table.agg(F.max("position").alias("p")).first()
    return None if row is None else row["p"]


def refresh_changelog(spark: SparkSession, tables: CollectionTables, landing_files: Sequence[str]) -> ChangelogRefresh:
    """``landing_files`` are all the collection's current files: new or re-written ones are (re)read, rows of
    files no longer listed (a superseded snapshot the Dagster assets removed) are deleted."""
    files = list(landing_files)
    if table_exists(spark, tables.changelog) and files:
        DeltaTable.forPath(spark, tables.changelog).delete(~F.col("landing_file").isin(files))
    elif table_exists(spark, tables.changelog):
        DeltaTable.forPath(spark, tables.changelog).delete()
    todo = changed_files(spark, tables.changelog, files)
    rows, counts = 0, {}
    if todo:
        written = write_changelog(spark, tables.changelog, todo)
        rows, counts = written.rows, written.counts.get(tables.namespace, {})
    table = read_changelog(spark, tables.changelog).where(F.col("collection") == tables.namespace)
    return ChangelogRefresh(tables.namespace, len(todo), rows, counts, table.count(),
                            _max_position(spark, tables.changelog, tables.namespace), table.schema)


def refresh_current_state(spark: SparkSession, tables: CollectionTables,
                          options: TableOptions = TableOptions()) -> StateRefresh:
    """Rebuilt from the whole changelog (the adapter is not incremental)."""
    if table_exists(spark, tables.current_state):
        DeltaTable.forPath(spark, tables.current_state).delete()
    merged = merge_current_state(spark, tables.changelog, tables.current_state, collections=[tables.namespace])
    state = read_current_state(spark, tables.current_state)
    changes = [f"added column {c}" for c in merged.new_columns]
    changes += [f"field {c}: widened to {t}" for c, t in merged.widened.items()]
    return StateRefresh(tables.namespace, merged.keys_touched, merged.upserted, merged.deleted,
                        merged.rows.get(tables.namespace, 0),
                        _max_position(spark, tables.changelog, tables.namespace), state.schema, changes)


class _ChangedKeys:
    """A sink that keeps the canonical ``_id`` of every change event (keys changed since a position)."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def write(self, records: Sequence[Record]) -> None:
        for record in records:
            if record.op is None:
                continue
            key = json_util.loads(landing_row(record)["key"] or "{}").get("id")
            if isinstance(key, str):
                self.keys.add(documents.canonical_json(json_util.loads(key)))

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None


def reconcile_at_position(spark: SparkSession, tables: CollectionTables, cfg: ConnectorConfig) -> Reconciliation:
    """The table against the source as it was at the table's position: keys changed since then (read
    from the change stream) are left out on both sides and counted."""
    namespace = tables.namespace
    position = _max_position(spark, tables.changelog, namespace)
    state = read_current_state(spark, tables.current_state)
    table = {r["id"]: _combine(r["hi"], r["lo"]) for r in _table_hashes(state, namespace).collect()}
    client = open_client(cfg)
    try:
        source = _source_hashes(client, namespace)
    finally:
        client.close()
    # the keys changed from the table's position until after the source was read (writes go on meanwhile)
    changed = _ChangedKeys()
    if position is not None:
        now = api.current_cluster_time(cfg)
        api.stream_window(cfg, namespace, Position.parse(position).timestamp, Timestamp(now.time, now.inc + 1), changed)
    excluded = changed.keys
    compared_table = {k: v for k, v in table.items() if k not in excluded}
    compared_source = {k: v for k, v in source.items() if k not in excluded}
    wrong = sorted(k for k in compared_table.keys() | compared_source.keys()
                   if compared_table.get(k) != compared_source.get(k))
    return Reconciliation(
        namespace, not wrong, position,
        f"keys changed since {position} left out ({len(excluded)})" if position else "empty table against the source",
        len(table), len(source), len(excluded & (table.keys() | source.keys())), wrong[:MAX_REPORTED_KEYS],
    )


def maintain(spark: SparkSession, tables: CollectionTables, *, retention_hours: int = 168) -> dict[str, int]:
    figures: dict[str, int] = {}
    for name, location in (("changelog", tables.changelog), ("current_state", tables.current_state)):
        if not table_exists(spark, location):
            continue
        table = DeltaTable.forPath(spark, location)
        table.optimize().executeCompaction()
        table.vacuum(retention_hours)
        figures[f"{name}_files"] = int(table.detail().first()["numFiles"])  # type: ignore[index]
    return figures
