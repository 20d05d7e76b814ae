"""changelog + current_state from converter-made landing files, in every order the design allows."""

from __future__ import annotations

import random
from pathlib import Path

import mongomock
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mongocdc_core.tables import (
    TableLocations,
    materialize,
    read_changelog,
    read_current_state,
    reconcile,
    refresh_current_state,
    write_changelog,
)
from mongocdc_core.tables.current_state import merge_current_state

from .workload import DB, Workload, converter, slice_records, snapshot_records, write_landing


def _expected_client(workload: Workload) -> mongomock.MongoClient:
    """The model's final documents in a mongomock database, so reconcile() compares against them."""
    client: mongomock.MongoClient = mongomock.MongoClient()
    for coll, docs in workload.docs.items():
        if docs:
            client[DB][coll].insert_many([dict(d) for d in docs.values()])
    return client


def _scenario(tmp: Path, capture_mode: str, seed: int) -> tuple[Workload, dict[str, Path]]:
    """Landing files: snapshot after some history, then three slices (one spans a transaction)."""
    rng = random.Random(seed)
    wl = Workload(rng, collections=("orders", "users"), full_document=capture_mode != "change_streams")
    conv = converter(capture_mode)
    files: dict[str, Path] = {}
    a0, a1 = wl.run(40)
    files["slice0"] = write_landing(tmp / "slice0.parquet", slice_records(conv, wl.events[a0:a1]))
    files["snap_orders"] = write_landing(tmp / "snap_orders.parquet", snapshot_records(conv, wl, "orders"))
    files["snap_users"] = write_landing(tmp / "snap_users.parquet", snapshot_records(conv, wl, "users"))
    for i in (1, 2, 3):
        s0, s1 = wl.run(60)
        files[f"slice{i}"] = write_landing(tmp / f"slice{i}.parquet", slice_records(conv, wl.events[s0:s1]))
    return wl, files


# Each step is one materialisation (several files at once where the order does not matter).
# Both plans write slices before their snapshot and re-materialise a slice at the end.
PLANS: dict[str, list[list[str]]] = {
    "change_streams_update_full": [["slice3"], ["slice1", "snap_users"], ["slice2", "snap_orders"], ["slice1"]],
    "change_streams": [["slice2"], ["slice1", "slice3"], ["snap_orders", "snap_users"], ["slice2"]],
}


@pytest.mark.parametrize("capture_mode", sorted(PLANS))
def test_current_state_matches_model_in_any_order(spark: SparkSession, tmp_path: Path, capture_mode: str) -> None:
    wl, files = _scenario(tmp_path / "landing", capture_mode, seed=len(capture_mode))
    tables = TableLocations(str(tmp_path / "tables"))
    namespaces = [f"{DB}.orders", f"{DB}.users"]
    expected = _expected_client(wl)
    plan = PLANS[capture_mode]

    _, first = materialize(spark, tables, [files[n] for n in plan[0]])
    early = reconcile(spark, tables.current_state, expected, namespaces)
    assert not early.matches and early.mismatching_keys
    assert all(k.split(" ")[0] in namespaces for k in early.mismatching_keys)
    if capture_mode == "change_streams":  # updates of documents whose full image has not landed yet
        assert first.pending_keys > 0
    for step in plan[1:]:
        _, merged = materialize(spark, tables, [files[n] for n in step])
    assert merged.pending_keys == 0

    result = reconcile(spark, tables.current_state, expected, namespaces)
    assert result.matches, result
    assert result.table_count == sum(len(d) for d in wl.docs.values()) == result.source_count

    # re-materialised files replaced their rows: each landing file's events appear exactly once
    changelog = read_changelog(spark, tables.changelog)
    written = {str(files[n].resolve()) for step in plan for n in step}
    assert {r["landing_file"] for r in changelog.select("landing_file").distinct().collect()} == written
    assert changelog.count() == changelog.dropDuplicates(["landing_file", "position", "_id", "op"]).count()

    # rebuilding from the whole changelog gives the same table as the incremental merges
    rebuilt = TableLocations(str(tmp_path / "rebuilt"))
    merge_current_state(spark, tables.changelog, rebuilt.current_state, collections=namespaces)
    incremental = {r["_id"]: r["document"] for r in read_current_state(spark, tables.current_state).collect()}
    again = {r["_id"]: r["document"] for r in read_current_state(spark, rebuilt.current_state).collect()}
    assert again == incremental
    assert read_current_state(spark, rebuilt.current_state).where(F.col("op") == "d").count() == 0


def test_refresh_follows_the_changelog_change_feed(spark: SparkSession, tmp_path: Path) -> None:
    """What the Dagster current_state asset runs: first a rebuild, then only what the changelog gained."""
    wl, files = _scenario(tmp_path / "landing", "change_streams", seed=21)
    tables = TableLocations(str(tmp_path / "tables"))
    namespaces = [f"{DB}.orders", f"{DB}.users"]
    write_changelog(spark, tables.changelog, [files["snap_orders"], files["snap_users"], files["slice1"]])
    first = refresh_current_state(spark, tables, namespaces)
    assert first.upserted > 0
    write_changelog(spark, tables.changelog, [files["slice3"], files["slice2"]])
    second = refresh_current_state(spark, tables, namespaces)
    new_keys = {
        (row["collection"], row["key"])
        for name in ("slice2", "slice3")
        for row in pq.read_table(files[name], columns=["collection", "key", "op"]).to_pylist()
        if row["op"] is not None
    }
    assert second.keys_touched == len(new_keys)  # only the keys the change feed brought, not a rebuild
    assert reconcile(spark, tables.current_state, _expected_client(wl), namespaces).matches
    assert refresh_current_state(spark, tables, namespaces).keys_touched == 0  # nothing new
