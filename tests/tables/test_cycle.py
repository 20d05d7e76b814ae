"""A refresh cycle over many collections costs what landed: nothing new starts no Spark job.

Four collections are snapshotted and refreshed together (``refresh_collections``, several at once);
a second cycle after only empty slice files landed (windows without an event) starts no Spark job at
all (counted by the SparkContext's job ids, whatever thread or group ran them); after one collection
gets a change, a cycle refreshes that one only, and its tables hold the change.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from mongocdc_core.tables import CollectionRefresh, CollectionTables, read_current_state, refresh_collections
from mongocdc_core.tables.changelog import landing_by_collection
from mongocdc_core.tables.collection import concurrently

from .workload import DB, Workload, converter, slice_records, snapshot_records, write_landing

COLLECTIONS = 4

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def jobs_started(spark: SparkSession) -> int:
    """Spark jobs the SparkContext has started so far (its scheduler's next job id)."""
    return int(spark._jsc.sc().dagScheduler().nextJobId())  # type: ignore[union-attr]


def test_a_cycle_with_nothing_new_starts_no_spark_job(spark: SparkSession, tmp_path: Path) -> None:
    names = [f"c{i:02d}" for i in range(COLLECTIONS)]
    wl = Workload(random.Random(39), collections=names, full_document=True)
    for name in names:
        for _ in range(3):
            wl.insert(name, wl._tick())
    conv = converter("change_streams_update_full")
    landing = tmp_path / "landing"
    for name in names:
        write_landing(landing / "snapshot" / f"{DB}.{name}" / "snapshot.parquet", snapshot_records(conv, wl, name))
    root = str(tmp_path / "tables")

    def cycle() -> dict[str, CollectionRefresh]:
        found = landing_by_collection([landing])
        work = [(CollectionTables.under(root, ns), found[ns]) for ns in sorted(found)]
        done = {r.namespace: r for r in refresh_collections(spark, work)}
        assert len(done) == COLLECTIONS and not [r.error for r in done.values() if r.error is not None]
        return done

    first = cycle()
    assert all(r.new_data and r.current_state.row_count == 3 for r in first.values())

    for name in names:  # a window with no event of a collection lands an empty slice file
        write_landing(landing / "stream_slice" / f"{DB}.{name}" / "slice-0.parquet", [])
    before = jobs_started(spark)
    quiet = cycle()
    assert jobs_started(spark) - before == 0  # not one Spark job for all those collections with nothing new
    for r in quiet.values():
        assert not r.new_data
        assert (r.changelog.row_count, r.current_state.row_count) == (3, 3)
        assert r.changelog.position == first[r.namespace].changelog.position
        assert r.current_state.schema == first[r.namespace].current_state.schema

    wl.update("c02", wl._tick())
    changed = wl.events[-1]
    write_landing(landing / "stream_slice" / f"{DB}.c02" / "slice-1.parquet", slice_records(conv, [changed]))
    before = jobs_started(spark)
    after = cycle()
    assert jobs_started(spark) > before
    assert [ns for ns, r in after.items() if r.new_data] == [f"{DB}.c02"]
    assert all(r.changelog.work.jobs == r.current_state.work.jobs == 0
               for ns, r in after.items() if ns != f"{DB}.c02")
    c02 = after[f"{DB}.c02"]
    assert (c02.changelog.rows_added, c02.changelog.row_count) == (1, 4)
    assert c02.current_state.keys_merged == 1
    assert c02.current_state.position == changed.position.to_str()
    state = read_current_state(spark, CollectionTables.under(root, f"{DB}.c02").current_state)
    assert state.count() == 3 and state.where(f"__position = '{changed.position.to_str()}'").count() == 1


def test_concurrent_sessions_keep_the_settings_made_at_run_time(spark: SparkSession) -> None:
    """A cycle's sessions (and a micro-batch's) start with what the user set on their session at run time,
    credentials as ``fs.s3a.*`` say, not only the SparkContext's configuration."""
    spark.conf.set("fs.mongocdc-probe.key", "secret")
    spark.conf.set("spark.sql.session.timeZone", "Asia/Tokyo")
    try:
        seen = dict(concurrently(spark, ["a", "b"], lambda session, _: (
            session is not spark, session.conf.get("fs.mongocdc-probe.key", None),
            session.conf.get("spark.sql.session.timeZone")), concurrency=2))
    finally:
        spark.conf.unset("fs.mongocdc-probe.key")
        spark.conf.unset("spark.sql.session.timeZone")
    assert seen == {"a": (True, "secret", "Asia/Tokyo"), "b": (True, "secret", "Asia/Tokyo")}
