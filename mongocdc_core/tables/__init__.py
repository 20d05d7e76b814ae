"""Lakehouse tables from the landing zone or Kafka: per collection a Delta ``changelog`` and ``current_state``.

Pure PySpark, no Dagster: the Dagster assets, the demo and the streaming job all call these
(:mod:`mongocdc_core.tables.collection` is the API).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from rich.console import Console
from rich.table import Table

from mongocdc_core.tables.changelog import TableInputError, landing_files, read_changelog, table_exists
from mongocdc_core.tables.collection import (
    ChangelogRefresh,
    CollectionRefresh,
    CollectionTables,
    Reconciliation,
    SourceRead,
    StateRefresh,
    TableOptions,
    combined_changelog,
    maintain,
    read_source_at,
    reconcile_at_position,
    refresh_changelog,
    refresh_collections,
    refresh_current_state,
)
from mongocdc_core.tables.current_state import read_current_state
from mongocdc_core.tables.jars import SparkSetupError
from mongocdc_core.tables.session import spark_conf, spark_session, start_session
from mongocdc_core.tables.typed_columns import quote

__all__ = [
    "ChangelogRefresh",
    "CollectionRefresh",
    "CollectionTables",
    "Reconciliation",
    "SourceRead",
    "SparkSetupError",
    "StateRefresh",
    "TableInputError",
    "TableOptions",
    "TablesSummary",
    "combined_changelog",
    "landing_files",
    "maintain",
    "print_tables",
    "read_changelog",
    "read_current_state",
    "read_source_at",
    "reconcile_at_position",
    "refresh_changelog",
    "refresh_collections",
    "refresh_current_state",
    "spark_conf",
    "spark_session",
    "start_session",
]


@dataclass(frozen=True)
class TablesSummary:
    """Row counts per collection of both tables (what :func:`print_tables` showed)."""

    changelog_rows: dict[str, int]
    current_state_rows: dict[str, int]


def print_tables(
    spark: SparkSession, tables: Sequence[CollectionTables], *, limit: int = 5, console: Console | None = None
) -> TablesSummary:
    """Print the row counts of each collection's tables and its first ``limit`` current_state rows."""
    console = console or Console()
    log_counts: dict[str, int] = {}
    state_counts: dict[str, int] = {}
    overview = Table(title="mongocdc tables")
    for name in ("collection", "changelog rows", "current_state rows", "current_state"):
        overview.add_column(name)
    for t in tables:
        log_counts[t.namespace] = read_changelog(spark, t.changelog).count()
        state_counts[t.namespace] = read_current_state(spark, t.current_state).count() if table_exists(
            spark, t.current_state
        ) else 0
        overview.add_row(t.namespace, str(log_counts[t.namespace]), str(state_counts[t.namespace]), t.current_state)
    console.print(overview)
    for t in tables:
        if not state_counts.get(t.namespace):
            continue
        frame = read_current_state(spark, t.current_state)
        shown = [c for c in frame.columns if c != "__key"][:8]
        detail = Table(title=f"current_state {t.namespace} (first {limit} by _id)")
        for column in shown:
            detail.add_column(column, overflow="fold")
        types = dict(frame.dtypes)
        typed = frame.select(*[
            (F.to_json(F.col(quote(c))) if types[c] == "variant" else F.col(quote(c)).cast("string")).alias(f"c{i}")
            for i, c in enumerate(shown)
        ])
        for row in typed.orderBy("c0").limit(limit).collect():
            detail.add_row(*[("" if v is None else str(v))[:60] for v in row])
        console.print(detail)
    return TablesSummary(log_counts, state_counts)
