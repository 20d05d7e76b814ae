"""Lakehouse tables from the landing zone or Kafka: ``changelog`` and ``current_state`` (Delta Lake).

Pure PySpark, no Dagster: the Dagster assets, the demo and the streaming job all call these.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

from mongocdc_core.tables.changelog import (
    ChangelogWrite,
    TableInputError,
    landing_files,
    read_changelog,
    table_exists,
    write_changelog,
)
from mongocdc_core.tables.current_state import MergeResult, merge_current_state, read_current_state
from mongocdc_core.tables.reconcile import CollectionReconciliation, ReconcileResult, reconcile
from mongocdc_core.tables.session import SparkSetupError, spark_conf, spark_session

ENV_HOME = "MONGOCDC_HOME"
ENV_TABLES = "MONGOCDC_TABLES"

__all__ = [
    "ChangelogWrite",
    "CollectionReconciliation",
    "MergeResult",
    "ReconcileResult",
    "SparkSetupError",
    "TableInputError",
    "TableLocations",
    "TablesSummary",
    "materialize",
    "merge_current_state",
    "print_tables",
    "read_changelog",
    "read_current_state",
    "reconcile",
    "refresh_current_state",
    "spark_conf",
    "spark_session",
    "write_changelog",
]


@dataclass(frozen=True)
class TableLocations:
    """Where the two tables live: ``<root>/changelog`` and ``<root>/current_state`` (any Spark URI)."""

    root: str

    @property
    def changelog(self) -> str:
        return f"{self.root.rstrip('/')}/changelog"

    @property
    def current_state(self) -> str:
        return f"{self.root.rstrip('/')}/current_state"

    @classmethod
    def default(cls) -> TableLocations:
        """``MONGOCDC_TABLES`` if set, else ``$MONGOCDC_HOME/tables``."""
        if os.environ.get(ENV_TABLES):
            return cls(os.environ[ENV_TABLES])
        home = os.environ.get(ENV_HOME)
        if not home:
            raise TableInputError(f"set {ENV_HOME} (tables go to $MONGOCDC_HOME/tables) or {ENV_TABLES}")
        return cls(str(Path(home) / "tables"))


def materialize(
    spark: SparkSession, locations: TableLocations, paths: Sequence[str | os.PathLike[str]]
) -> tuple[ChangelogWrite, MergeResult]:
    """Write landing files into the changelog (replacing their earlier rows), then merge current_state.

    The keys merged are those of the files' new rows and of the rows they replace, so a re-written
    file that lost an event still gets its keys recomputed.
    """
    files = landing_files(paths)
    previous = (
        read_changelog(spark, locations.changelog)
        .where(F.col("landing_file").isin(files))
        .select("collection", "_id")
        .distinct()
        .localCheckpoint()
    )
    written = write_changelog(spark, locations.changelog, files)
    keys = written.written.select("collection", "_id").union(previous)
    merged = merge_current_state(spark, locations.changelog, locations.current_state, changes=keys)
    return written, merged


WATERMARK_PROPERTY = "mongocdc.changelogVersion."


def _combine(location: str, results: list[MergeResult]) -> MergeResult:
    out = MergeResult(location)
    for r in results:
        out.keys_touched += r.keys_touched
        out.upserted += r.upserted
        out.deleted += r.deleted
        out.pending_keys += r.pending_keys
        out.new_columns += [c for c in r.new_columns if c not in out.new_columns]
        out.widened |= r.widened
        out.rows |= r.rows
    return out


def refresh_current_state(spark: SparkSession, locations: TableLocations, collections: Sequence[str]) -> MergeResult:
    """Merge into current_state what the changelog gained since the last refresh of each collection.

    The changelog version merged last is kept per collection as a current_state table property;
    the keys of rows added or replaced since then come from the changelog's change data feed. A
    collection without that property (first run) is rebuilt from its whole changelog.
    """
    if not table_exists(spark, locations.changelog):
        raise TableInputError(f"no changelog table at {locations.changelog}: materialise changelog first")
    latest = int(DeltaTable.forPath(spark, locations.changelog).history(1).select("version").first()[0])  # type: ignore[index]
    props: dict[str, str] = {}
    if table_exists(spark, locations.current_state):
        detail = DeltaTable.forPath(spark, locations.current_state).detail().select("properties").first()
        props = dict(detail[0]) if detail is not None else {}
    marks = {ns: int(props[WATERMARK_PROPERTY + ns]) for ns in collections if WATERMARK_PROPERTY + ns in props}
    results = []
    rebuild = [ns for ns in collections if ns not in marks]
    if rebuild:
        results.append(merge_current_state(spark, locations.changelog, locations.current_state, collections=rebuild))
    behind = [ns for ns, version in marks.items() if version < latest]
    if behind:
        changes = (
            spark.read.format("delta").option("readChangeFeed", "true")
            .option("startingVersion", min(marks[ns] for ns in behind) + 1).option("endingVersion", latest)
            .load(locations.changelog)
            .where(F.col("collection").isin(behind))
            .select("collection", "_id")
        )
        results.append(merge_current_state(spark, locations.changelog, locations.current_state, changes=changes))
    if table_exists(spark, locations.current_state) and collections:
        assignments = ", ".join(f"'{WATERMARK_PROPERTY}{ns}' = '{latest}'" for ns in collections)
        spark.sql(f"ALTER TABLE delta.`{locations.current_state}` SET TBLPROPERTIES ({assignments})")
    return _combine(locations.current_state, results)


@dataclass(frozen=True)
class TablesSummary:
    """Row counts per collection of both tables (what :func:`print_tables` showed)."""

    changelog_rows: dict[str, int]
    current_state_rows: dict[str, int]


def print_tables(
    spark: SparkSession,
    locations: TableLocations | None = None,
    *,
    limit: int = 10,
    console: Console | None = None,
) -> TablesSummary:
    """Print row counts of both tables and the first ``limit`` current_state rows of each collection."""
    locations = locations or TableLocations.default()
    console = console or Console()
    changelog = read_changelog(spark, locations.changelog)
    state = read_current_state(spark, locations.current_state)
    log_counts = {r["collection"]: int(r["count"]) for r in changelog.groupBy("collection").count().collect()}
    state_counts = {r["collection"]: int(r["count"]) for r in state.groupBy("collection").count().collect()}
    overview = Table(title=f"mongocdc tables in {locations.root}")
    for name in ("collection", "changelog rows", "current_state rows"):
        overview.add_column(name)
    for name in sorted(log_counts.keys() | state_counts.keys()):
        overview.add_row(name, str(log_counts.get(name, 0)), str(state_counts.get(name, 0)))
    console.print(overview)
    for name in sorted(state_counts):
        rows = state.where(F.col("collection") == name).orderBy("_id").limit(limit).collect()
        detail = Table(title=f"current_state {name} (first {limit} by _id)")
        for column in ("_id", "op", "position", "document"):
            detail.add_column(column, overflow="fold")
        for row in rows:
            detail.add_row(row["_id"], row["op"], row["position"], row["document"])
        console.print(detail)
    return TablesSummary(log_counts, state_counts)
