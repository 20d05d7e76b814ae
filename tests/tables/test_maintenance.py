"""OPTIMIZE and VACUUM of a collection's tables (the Dagster maintenance job's work): files are
compacted and removed, what a user reads is unchanged, and refreshes stay incremental afterwards."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from bson.timestamp import Timestamp
from pyspark.sql import SparkSession

from mongocdc_core.positions import Position
from mongocdc_core.tables import (
    CollectionTables,
    TableInputError,
    current_state,
    read_changelog,
    read_current_state,
    refresh_changelog,
    refresh_current_state,
)
from mongocdc_core.tables.collection import maintain

from .support import comparable, read_file
from .workload import DB, Event, converter, slice_records, write_landing


def _updates(tmp: Path, name: str, first: int, ids: range) -> Path:
    events = [
        Event({"operationType": "update", "ns": {"db": DB, "coll": "orders"}, "documentKey": {"_id": i},
               "clusterTime": Timestamp(first, i + 1), "fullDocument": {"_id": i, "qty": first + i},
               "updateDescription": {"updatedFields": {"qty": first + i}, "removedFields": [], "truncatedArrays": []}},
              Position(first, i + 1))
        for i in ids
    ]  # fmt: skip
    return write_landing(tmp / f"{name}.parquet", slice_records(converter("change_streams_update_full"), events))


def test_maintenance_compacts_and_vacuums_without_changing_what_users_read(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # MERGEs that write deletion vectors, as a large table's do: they leave files to compact (a small
    # table's MERGE rewrites the file it touches, so its table stays one file, with nothing to compact)
    monkeypatch.setattr(current_state, "_SMALL_TABLE_BYTES", -1)
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    files = [read_file(tmp_path / "snap.parquet", DB, "orders", [{"_id": i, "qty": i} for i in range(30)], Position(100, 1))]
    for n in range(3):  # one commit (and new files) per refresh
        files.append(_updates(tmp_path, f"s{n}", 200 + n, range(n * 10, n * 10 + 10)))
        refresh_changelog(spark, tables, [str(f) for f in files])
        refresh_current_state(spark, tables)
    state_before = comparable(read_current_state(spark, tables.current_state))
    log_before = comparable(read_changelog(spark, tables.changelog))

    with pytest.raises(TableInputError, match="retention_hours"):
        maintain(spark, tables, retention_hours=-1)
    said: list[str] = []
    kept = maintain(spark, tables, progress=said.append)  # the default week: compaction, nothing old enough to vacuum
    assert [line.split(": done in ")[0] for line in said if ": done in " in line] == [
        f"maintenance of {DB}.orders {kind}" for kind in ("changelog", "current_state")]
    # VACUUM lists each table's one directory in a few tasks, not in Spark's default 10,000 (30 s each on two cores)
    tasks = [int(re.search(r"(\d+) task\(s\)", line)[1]) for line in said if ": done in " in line]  # type: ignore[index]
    assert all(0 < n < 200 for n in tasks), said
    assert spark.conf.get("spark.sql.sources.parallelPartitionDiscovery.parallelism", None) is None  # restored
    assert kept["current_state_files_added"] >= 1 and kept["current_state_files_removed"] >= 2, kept
    assert kept["current_state_files_vacuumed"] == 0 and kept["changelog_files_vacuumed"] == 0, kept
    gone = maintain(spark, tables, retention_hours=0)  # an operator's choice below Delta's safety check
    assert gone["current_state_files_vacuumed"] >= 2, gone
    assert spark.conf.get("spark.databricks.delta.retentionDurationCheck.enabled", "true") == "true"  # restored
    assert comparable(read_current_state(spark, tables.current_state)) == state_before
    assert comparable(read_changelog(spark, tables.changelog)) == log_before
    # maintenance changes no row: the state the last refreshes recorded still holds, and nothing new costs no job
    quiet_log = refresh_changelog(spark, tables, [str(f) for f in files])
    quiet_state = refresh_current_state(spark, tables)
    assert (quiet_log.work.jobs, quiet_log.files_read, quiet_state.work.jobs, quiet_state.keys_merged) == (0, 0, 0, 0)
    assert (quiet_log.row_count, quiet_state.row_count) == (60, 30)

    files.append(_updates(tmp_path, "after", 300, range(5)))
    refresh_changelog(spark, tables, [str(f) for f in files])
    result = refresh_current_state(spark, tables)
    assert (result.keys_merged, result.row_count) == (5, 30)
    assert {r["_id"]: r["qty"] for r in read_current_state(spark, tables.current_state).collect()}[4] == 304
