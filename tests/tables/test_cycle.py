"""A refresh cycle over many collections costs what landed: nothing new starts no Spark job.

Four collections are snapshotted and refreshed together (``refresh_collections``, several at once);
a second cycle after only empty slice files landed (windows without an event) starts no Spark job at
all (counted by the SparkContext's job ids, whatever thread or group ran them); after one collection
gets a change, a cycle refreshes that one only, and its tables hold the change.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.tables import (
    ChangelogRefresh,
    CollectionRefresh,
    CollectionTables,
    read_current_state,
    refresh_collections,
)
from mongocdc_core.tables.changelog import (
    ROWS_VERSION_PROPERTY,
    STATE_KEY,
    landing_by_collection,
    look,
    set_properties,
)
from mongocdc_core.tables.collection import concurrently
from mongocdc_core.tables.current_state import VERSION_PROPERTY

from .workload import DB, Workload, converter, slice_records, snapshot_records, write_landing

COLLECTIONS = 4

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def jobs_started(spark: SparkSession) -> int:
    """Spark jobs the SparkContext has started so far (its scheduler's next job id)."""
    return int(spark._jsc.sc().dagScheduler().nextJobId())  # type: ignore[union-attr]


def _snapshotted(tmp_path: Path, names: list[str], seed: int) -> tuple[Workload, EventConverter, Path]:
    """Three documents in each collection, landed as its snapshot under ``tmp_path/landing``."""
    wl = Workload(random.Random(seed), collections=names, full_document=True)
    for name in names:
        for _ in range(3):
            wl.insert(name, wl._tick())
    conv = converter("change_streams_update_full")
    landing = tmp_path / "landing"
    for name in names:
        write_landing(landing / "snapshot" / f"{DB}.{name}" / "snapshot.parquet", snapshot_records(conv, wl, name))
    return wl, conv, landing


def test_a_cycle_with_nothing_new_starts_no_spark_job(spark: SparkSession, tmp_path: Path) -> None:
    names = [f"c{i:02d}" for i in range(COLLECTIONS)]
    wl, conv, landing = _snapshotted(tmp_path, names, seed=39)
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


def _commits(location: str) -> list[dict[str, object]]:
    """The ``commitInfo`` of each commit in the table's Delta log, oldest first."""
    infos = []
    for path in sorted(Path(location, "_delta_log").glob("*.json")):
        infos += [json.loads(line)["commitInfo"] for line in path.read_text().splitlines() if '"commitInfo"' in line]
    return infos


def test_a_refresh_makes_one_commit_per_table_and_tables_of_earlier_versions_are_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Each table's refresh records its state (positions, digest, kinds, row count) in its data commit's
    ``userMetadata``, not in a second commit of table properties; a quiet cycle reads it back without a
    Spark job. One collection's tables are first turned into what an earlier mongocdc left: the state as
    table properties, set by a commit of their own; they are read as such, refreshed incrementally, and
    recorded the new way from then on."""
    names = ["c00", "c01"]
    wl, conv, landing = _snapshotted(tmp_path, names, seed=41)
    root = str(tmp_path / "tables")
    tables = {name: CollectionTables.under(root, f"{DB}.{name}") for name in names}

    def cycle() -> dict[str, CollectionRefresh]:
        found = landing_by_collection([landing])
        done = {r.namespace.split(".")[1]: r for r in refresh_collections(
            spark, [(tables[name], found[f"{DB}.{name}"]) for name in names])}
        assert not [r.error for r in done.values() if r.error is not None]
        return done

    cycle()
    old = tables["c01"]
    for location in (old.changelog, old.current_state):  # the state as an earlier version kept it (current_state
        found = look(spark, location)  # then recorded the changelog's version after its properties' commit)
        recorded = {k: v for k, v in found.properties.items() if k.startswith("mongocdc.")}
        recorded[ROWS_VERSION_PROPERTY] = str(found.version + 1)
        if location == old.current_state:
            recorded[VERSION_PROPERTY] = str(look(spark, old.changelog).version)
        set_properties(spark, location, recorded)
        assert look(spark, location).properties == found.properties | recorded
    before = jobs_started(spark)
    quiet = cycle()
    assert jobs_started(spark) == before and not any(r.new_data for r in quiet.values())

    for name in names:  # a delete: no new field, so no column added (a commit of its own) either
        wl.delete(name, wl._tick())
        write_landing(landing / "stream_slice" / f"{DB}.{name}" / "slice-1.parquet", slice_records(conv, [wl.events[-1]]))
    counts = {(name, kind): len(_commits(getattr(tables[name], kind))) for name in names
              for kind in ("changelog", "current_state")}  # fmt: skip
    changed = cycle()
    for name in names:
        done = changed[name]
        assert (done.changelog.rows_added, done.changelog.row_count) == (1, 4)
        assert (done.current_state.keys_merged, done.current_state.row_count) == (1, 2)
        assert done.changelog.position == done.current_state.position == wl.events[-1 if name == "c01" else -2].position.to_str()
        for kind in ("changelog", "current_state"):
            infos = _commits(getattr(tables[name], kind))
            assert len(infos) == counts[(name, kind)] + 1, (name, kind)  # one commit per table and refresh
            assert infos[-1]["operation"] == ("WRITE" if kind == "changelog" else "MERGE")
            assert STATE_KEY in json.loads(str(infos[-1]["userMetadata"]))
    before = jobs_started(spark)
    quiet = cycle()
    assert jobs_started(spark) == before
    for name in names:
        assert (quiet[name].changelog.row_count, quiet[name].current_state.row_count) == (4, 2)
        assert quiet[name].changelog.position == changed[name].changelog.position


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


def test_an_item_runs_again_in_a_slot_that_frees_while_others_still_run(spark: SparkSession) -> None:
    """Several at once: an item whose probe says so runs again in the next slot that frees, ahead of the
    queued ones, and is yielded once, both results combined; b waits for that second run, so it ran while
    b was still running."""
    second = threading.Event()
    runs: list[str] = []
    polls: list[str] = []

    def action(_: SparkSession, item: str) -> str:
        runs.append(item)
        if item == "b":
            assert second.wait(120)
        if runs.count("a") == 2 and item == "a":
            second.set()
        return item

    def again(item: str, _: str) -> Callable[[], bool] | None:
        return (lambda: not polls.append(item)) if item == "a" else None

    out = list(concurrently(spark, ["a", "b", "c"], action, concurrency=2, again=again,
                            combine=lambda first, later: f"{first}+{later}"))
    # (b's thread may append to runs after a's runs, and finish in the same moment as a's second run)
    assert sorted(out) == [("a", "a+a"), ("b", "b"), ("c", "c")]
    assert [r for r in runs if r != "b"] == ["a", "a", "c"] and polls == ["a"]


def test_each_collections_current_state_follows_its_own_changelog(spark: SparkSession, tmp_path: Path) -> None:
    """In a cycle a collection's current_state is refreshed right after its changelog, not once every
    changelog is: one at a time, the first collection's current_state commit comes before the second's
    changelog commit (Delta's commit timestamps). Right after a changelog's refresh the ``after_changelog``
    hook sees that changelog's new version and its current_state not yet refreshed; a collection given no
    landing files has only its current_state refreshed, one left out of ``states`` only its changelog; and a
    current_state that fails leaves its changelog's refresh in the result beside the error."""
    names = ["c00", "c01", "c02"]
    wl, conv, landing = _snapshotted(tmp_path, names, seed=43)
    root = str(tmp_path / "tables")
    tables = {name: CollectionTables.under(root, f"{DB}.{name}") for name in names}
    found = landing_by_collection([landing])
    hooked: dict[str, tuple[int, bool]] = {}

    def after_changelog(done_tables: CollectionTables, refresh: ChangelogRefresh) -> None:
        assert refresh.namespace == done_tables.namespace and refresh.rows_added == 3
        hooked[done_tables.namespace] = (look(spark, done_tables.changelog).version,
                                         look(spark, done_tables.current_state).version >= 0)

    work = [(tables[name], found[f"{DB}.{name}"]) for name in names[:2]]
    done = list(refresh_collections(spark, work, concurrency=1, after_changelog=after_changelog))
    assert [r.namespace for r in done] == [f"{DB}.c00", f"{DB}.c01"] and all(r.error is None for r in done)
    assert hooked == {f"{DB}.c00": (0, False), f"{DB}.c01": (0, False)}
    stamp = {(name, kind): int(_commits(getattr(tables[name], kind))[-1]["timestamp"])  # type: ignore[call-overload]
             for name in names[:2] for kind in ("changelog", "current_state")}
    assert stamp[("c00", "changelog")] <= stamp[("c00", "current_state")] <= stamp[("c01", "changelog")]
    assert stamp[("c01", "changelog")] <= stamp[("c01", "current_state")]

    # c02: its changelog only; then its current_state only
    only_log = list(refresh_collections(spark, [(tables["c02"], found[f"{DB}.c02"])], states=set()))
    assert only_log[0].changelog is not None and only_log[0].current_state is None and only_log[0].error is None
    assert look(spark, tables["c02"].current_state).version < 0
    only_state = list(refresh_collections(spark, [(tables["c02"], None)]))
    assert only_state[0].changelog is None and only_state[0].current_state is not None
    assert only_state[0].current_state.row_count == 3

    # a current_state that cannot be refreshed (its table's log is torn) keeps the changelog's refresh
    wl.update("c00", wl._tick())
    write_landing(landing / "stream_slice" / f"{DB}.c00" / "slice-0.parquet", slice_records(conv, [wl.events[-1]]))
    log_dir = Path(tables["c00"].current_state, "_delta_log")
    for entry in log_dir.glob("*.json"):
        entry.write_text("{not json")
    failed = list(refresh_collections(spark, [(tables["c00"], landing_by_collection([landing])[f"{DB}.c00"])]))
    assert failed[0].error is not None and failed[0].current_state is None
    assert failed[0].changelog is not None and failed[0].changelog.rows_added == 1


def test_a_hot_collection_is_refreshed_again_when_more_of_it_lands_during_the_cycle(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A collection whose changelog's latest append added at least ``again_rows`` rows (its refresh's, or where
    that found nothing new, the one before), and of which a window holding events landed while the cycle went
    on, is refreshed once more before the collections still queued, and yielded once, both refreshes summed; a
    window that landed empty, or a collection below ``again_rows``, is not.
    One at a time: c00 twice; c01 (hot, but its window landed empty) is held back while c02 refreshes, in
    case more of it lands, and yielded after it."""
    names = ["c00", "c01", "c02"]
    wl, conv, landing = _snapshotted(tmp_path, names, seed=47)
    root = str(tmp_path / "tables")
    tables = {name: CollectionTables.under(root, f"{DB}.{name}") for name in names}
    found = landing_by_collection([landing])
    slices = {name: landing / "stream_slice" / f"{DB}.{name}" for name in names}
    listed: list[str] = []
    finished: list[str] = []

    def landed(done: CollectionTables) -> list[str]:
        """c00's next window lands (2 updates) once its first refresh is done; c01's lands empty."""
        name = done.namespace.split(".")[1]
        listed.append(name)
        if name == "c00" and not (slices[name] / "w1.parquet").exists():
            for _ in range(2):
                wl.update(name, wl._tick())
            write_landing(slices[name] / "w1.parquet", slice_records(conv, wl.events[-2:]))
        if name == "c01":
            write_landing(slices[name] / "w1.parquet", [])
        return sorted(str(p) for p in (landing / "snapshot" / done.namespace).glob("*.parquet")) + sorted(
            str(p) for p in slices[name].glob("*.parquet"))

    def progress(line: str) -> None:
        if "refreshed again" in line:
            finished.append(line)

    done = list(refresh_collections(spark, [(tables[name], found[f"{DB}.{name}"]) for name in names],
                                    concurrency=1, landed=landed, again_rows=3, progress=progress))
    assert [r.namespace for r in done] == [f"{DB}.c00", f"{DB}.c02", f"{DB}.c01"]
    assert all(r.error is None for r in done)
    hot = done[0]
    assert hot.changelog is not None and hot.current_state is not None
    assert (hot.changelog.files_read, hot.changelog.rows_added, hot.changelog.row_count) == (2, 5, 5)
    assert hot.changelog.counts == {"r": 3, "u": 2} and hot.changelog.work.jobs > 0
    assert hot.current_state.row_count == 3 and hot.current_state.position == wl.events[-1].position.to_str()
    assert hot.landing_files is not None and any(f.endswith("w1.parquet") for f in hot.landing_files)
    assert len(_commits(tables["c00"].changelog)) == 2 and len(_commits(tables["c00"].current_state)) >= 2
    assert finished == [f"{DB}.c00: more of it landed meanwhile; refreshed again in this cycle"]
    # listed: c00 once its first refresh was done (it had grown), c01 once its own was, c02 queued (its window
    # empty: not again); c02 ran last, nothing queued or running beside it, so not asked
    assert listed == ["c00", "c01"]
    assert [r.changelog.rows_added for r in done[1:] if r.changelog is not None] == [3, 3]
    assert done[2].landing_files == found[f"{DB}.c01"]  # given what it was given, not the listing that found nothing

    # c00 below again_rows: listed never, refreshed once; c01 and c02 found nothing new, yet their latest
    # append (their snapshot's 3 rows) keeps them hot: c01 is listed (nothing came), c02 ran last, not asked
    listed.clear()
    wl.update("c00", wl._tick())
    write_landing(slices["c00"] / "w2.parquet", slice_records(conv, wl.events[-1:]))
    again = list(refresh_collections(spark, [(tables[name], landed(tables[name])) for name in names],
                                     concurrency=1, landed=landed, again_rows=3))
    listed_by_cycle = listed[len(names):]
    assert listed_by_cycle == ["c01"]
    assert [(r.namespace, r.changelog.rows_added, r.changelog.latest_append) for r in again if r.changelog] == [
        (f"{DB}.c00", 1, 1), (f"{DB}.c02", 0, 3), (f"{DB}.c01", 0, 3)]

    # a listing that fails: no second refresh, said, and the cycle goes on
    for _ in range(3):
        wl.update("c00", wl._tick())
    write_landing(slices["c00"] / "w3.parquet", slice_records(conv, wl.events[-3:]))
    said: list[str] = []

    def unreadable(_: CollectionTables) -> list[str]:
        raise PermissionError("landing zone unreadable")

    failing = list(refresh_collections(spark, [(tables[name], landed(tables[name])) for name in names],
                                       concurrency=1, landed=unreadable, again_rows=3, progress=said.append))
    # c00 and c01 (hot) held back while the others refreshed, each listing's failure said once
    assert [(r.namespace, r.changelog.rows_added) for r in failing if r.changelog is not None] == [
        (f"{DB}.c02", 0), (f"{DB}.c00", 3), (f"{DB}.c01", 0)]
    assert all(r.error is None for r in failing)
    assert [line for line in said if "looked at again" in line] == [
        f"{DB}.{name}: its landing files could not be looked at again in this cycle (PermissionError: landing zone "
        "unreadable); the next refresh reads them" for name in ("c00", "c01")]

    # a hot collection whose refresh found nothing new (the cycle started just before its next window landed),
    # still waits for that window: it lands while c01 and c02 refresh, and c00 is refreshed again in the cycle
    finished.clear()
    current = {name: landed(tables[name]) for name in names}
    late: list[str] = []

    def lands_late(done: CollectionTables) -> list[str]:
        name = done.namespace.split(".")[1]
        if name == "c00" and not late:
            for _ in range(2):
                wl.update(name, wl._tick())
            write_landing(slices[name] / "w4.parquet", slice_records(conv, wl.events[-2:]))
            late.append(name)
        return landed(done)

    caught = list(refresh_collections(spark, [(tables[name], current[name]) for name in names], concurrency=1,
                                      landed=lands_late, again_rows=3, progress=progress))
    first = next(r for r in caught if r.namespace == f"{DB}.c00")
    assert first.changelog is not None and first.current_state is not None and first.error is None
    assert (first.changelog.files_read, first.changelog.rows_added, first.changelog.latest_append) == (1, 2, 2)
    assert first.current_state.position == wl.events[-1].position.to_str()
    assert finished == [f"{DB}.c00: more of it landed meanwhile; refreshed again in this cycle"]


def test_a_collection_whose_tables_the_cycle_builds_is_refreshed_again_when_a_busy_window_lands(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A deployment's first cycle starts with the collections' snapshots, so nothing tells yet which one is
    busy: a collection whose changelog the cycle builds is refreshed again in it when landing files holding
    ``again_rows`` rows in all came meanwhile (c00's first window, 4 updates), not when fewer did (c01's, 2);
    c01 is yielded once the others are done. In the next cycle (nothing built) a collection whose latest
    append is below ``again_rows`` (c01's 2 rows) is refreshed once: its landing files are not looked at again."""
    names = ["c00", "c01", "c02"]
    wl, conv, landing = _snapshotted(tmp_path, names, seed=53)
    root = str(tmp_path / "tables")
    tables = {name: CollectionTables.under(root, f"{DB}.{name}") for name in names}
    slices = {name: landing / "stream_slice" / f"{DB}.{name}" for name in names}
    windows: dict[str, list[int]] = {"c00": [4], "c01": [2]}  # the updates of each window still to land
    last: dict[str, str] = {}  # each collection's latest position
    said: list[str] = []

    def landed(done: CollectionTables) -> list[str]:
        """A collection's next window lands when its landing files are looked at (c02 gets none)."""
        name = done.namespace.split(".")[1]
        if windows.get(name):
            count = windows[name].pop(0)
            for _ in range(count):
                wl.update(name, wl._tick())
            last[name] = wl.events[-1].position.to_str()
            write_landing(slices[name] / f"w{len(list(slices[name].glob('*.parquet')))}.parquet",
                          slice_records(conv, wl.events[-count:]))
        return sorted(str(p) for p in (landing / "snapshot" / done.namespace).glob("*.parquet")) + sorted(
            str(p) for p in slices[name].glob("*.parquet"))

    found = landing_by_collection([landing])
    done = list(refresh_collections(spark, [(tables[name], found[f"{DB}.{name}"]) for name in names],
                                    concurrency=1, landed=landed, again_rows=4, progress=said.append))
    assert [r.namespace for r in done] == [f"{DB}.c00", f"{DB}.c02", f"{DB}.c01"]
    assert all(r.error is None for r in done)
    figures = {r.namespace.split(".")[1]: (r.changelog.files_read, r.changelog.rows_added) for r in done if r.changelog}
    assert figures == {"c00": (2, 7), "c01": (1, 3), "c02": (1, 3)}
    assert done[0].current_state is not None and done[0].current_state.position == last["c00"]
    assert [line for line in said if "refreshed again" in line] == [
        f"{DB}.c00: more of it landed meanwhile; refreshed again in this cycle"]

    # built before: c01's latest append (its first window's 2 rows) is below again_rows
    windows["c01"] = [4]
    said.clear()
    given = {name: sorted(str(p) for p in (landing / "snapshot" / f"{DB}.{name}").glob("*.parquet")) + sorted(
        str(p) for p in slices[name].glob("*.parquet")) for name in ("c01", "c02")}
    later = list(refresh_collections(spark, [(tables["c01"], given["c01"]), (tables["c02"], given["c02"])],
                                     concurrency=1, landed=landed, again_rows=4, progress=said.append))
    assert [(r.namespace, r.changelog.rows_added) for r in later if r.changelog] == [(f"{DB}.c01", 2), (f"{DB}.c02", 0)]
    assert not [line for line in said if "refreshed again" in line] and windows["c01"] == [4]
