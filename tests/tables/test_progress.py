"""Table refreshes report their Spark work: a progress line while a stage runs (tasks done, rate,
ETA), one line when done, and the jobs and tasks in the result; the caller's job group is kept."""

from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from mongocdc_core.receiver import duration
from mongocdc_core.tables import CollectionTables, refresh_changelog, refresh_current_state
from mongocdc_core.tables.changelog import TableInputError
from mongocdc_core.tables.spark_progress import GROUP_PROPERTIES, reporting

from .workload import DB, Workload, converter, slice_records, write_landing


@pytest.fixture
def callers_group(spark: SparkSession) -> Iterator[SparkSession]:
    """The session with a job group of the test's own on this thread (cleared after)."""
    spark.sparkContext.setJobGroup("the-callers-group", "the caller's own work")
    yield spark
    for key in GROUP_PROPERTIES:
        spark.sparkContext.setLocalProperty(key, None)  # type: ignore[arg-type]


def test_a_stage_that_runs_is_reported_with_its_tasks(spark: SparkSession, tmp_path: Path) -> None:
    """The tasks wait until a progress line was reported, so the line is seen while they run, whatever
    the machine's speed."""
    marker = str(tmp_path / "reported")
    lines: list[str] = []

    def report(line: str) -> None:
        lines.append(line)
        Path(marker).touch()

    def after_a_report(item: int) -> int:
        deadline = time.monotonic() + 120
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        return item

    with reporting(spark, "test work", report, every_s=0.05) as work:
        assert spark.sparkContext.parallelize(range(4), 4).map(after_a_report).count() == 4
    running = lines[0]
    assert re.fullmatch(r"test work: stage \d+ of Spark job \d+: [0-3] of 4 tasks \(\d+%\), [\d.]+ tasks/s, "
                        r"ETA [^;]+; 0 job\(s\) done, running \d+ s", running), running  # fmt: skip
    assert (work.jobs, work.tasks) == (1, 4) and work.seconds > 0
    assert lines[-1] == f"test work: done in {duration(work.seconds)}, 1 Spark job(s), 4 task(s)"


def test_refreshes_count_their_spark_work_and_keep_the_callers_job_group(
        spark: SparkSession, callers_group: SparkSession, tmp_path: Path) -> None:
    wl = Workload(random.Random(5), collections=("orders",), full_document=True)
    wl.run(40)
    landing = write_landing(tmp_path / "slice.parquet", slice_records(converter("change_streams_update_full"), wl.events))
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    context = callers_group.sparkContext
    lines: list[str] = []
    log = refresh_changelog(spark, tables, [landing], progress=lines.append)
    state = refresh_current_state(spark, tables, progress=lines.append)
    assert context.getLocalProperty("spark.jobGroup.id") == "the-callers-group"
    assert context.getLocalProperty("spark.job.description") == "the caller's own work"
    for refresh, label in ((log, "changelog"), (state, "current_state")):
        work = refresh.work
        assert work.jobs >= 1 and work.tasks >= 1 and work.seconds > 0  # a job may reuse a shuffle: no task of its own
        done = f"{label} of {DB}.orders: done in {duration(work.seconds)}, {work.jobs} Spark job(s), {work.tasks} task(s)"
        assert done in lines
    assert log.rows_added == log.row_count > 0 and state.row_count > 0


def test_a_failed_refresh_reports_no_end_and_keeps_the_callers_job_group(
        spark: SparkSession, callers_group: SparkSession, tmp_path: Path) -> None:
    tables = CollectionTables.under(str(tmp_path / "tables"), f"{DB}.orders")
    lines: list[str] = []
    with pytest.raises(TableInputError, match="no changelog table"):
        refresh_current_state(spark, tables, progress=lines.append)
    assert callers_group.sparkContext.getLocalProperty("spark.jobGroup.id") == "the-callers-group"
    assert not [line for line in lines if "done in" in line]
