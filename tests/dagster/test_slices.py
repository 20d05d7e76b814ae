"""Stream slices materialised in process (last in the directory, so the session's emulator is old enough that
the current one-minute window already lies inside its oplog and only the window's close is waited for)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
from dagster import DagsterInstance, materialize

from tests.dagster.cdc_helpers import CdcEnv, checks_of, materialization_metadata, register


def wait_for_window_inside_oplog(cdc: CdcEnv) -> datetime:
    """Now, or the start of the next window when the current one began before the oplog (a new emulator)."""
    first = datetime.fromtimestamp(cdc.mongocdc.oplog_window().first.time, UTC)
    now = datetime.now(UTC)
    key = cdc.partitions.window_key_containing(now)
    assert key is not None
    window = cdc.partitions.window(key)
    if window.start >= first:
        return now
    time.sleep((window.end - now).total_seconds() + 0.2)
    return datetime.now(UTC)


def test_stream_slice_lands_the_window_events(cdc: CdcEnv, instance: DagsterInstance) -> None:
    ns = cdc.ns("orders")
    cdc.db.orders.insert_one({"_id": 0, "qty": 0})
    started = wait_for_window_inside_oplog(cdc)
    cdc.db.orders.insert_many([{"_id": i, "qty": i} for i in range(1, 6)])
    cdc.db.orders.update_one({"_id": 1}, {"$set": {"qty": 100}})
    cdc.db.orders.delete_one({"_id": 2})
    cdc.db.other.insert_one({"_id": "not in this collection"})
    window_key = cdc.partitions.window_key_containing(started)
    assert window_key is not None
    window = cdc.partitions.window(window_key)
    time.sleep(max(0.0, (window.end - datetime.now(UTC)).total_seconds()) + 1.5)  # let the window close
    register(instance, ns)
    key = str(cdc.partitions.slice_key(ns, window_key))
    result = materialize([cdc.assets.stream_slice], partition_key=key, resources=cdc.resources, instance=instance)
    assert result.success and checks_of(result) == {"landing_envelopes": True}
    meta = materialization_metadata(instance, cdc.assets.stream_slice_key, key)
    assert meta["op_c"] >= 5 and meta["op_u"] == 1 and meta["op_d"] == 1
    path = Path(meta["path"])
    table = pq.read_table(path)
    assert set(table["collection"].to_pylist()) == {ns}
    assert table.num_rows == meta["events"] + 1  # the delete's tombstone
    stable = ["key", "op", "position", "before", "after", "updated_fields", "removed_fields"]
    first = table.select(stable).to_pylist()
    again = materialize([cdc.assets.stream_slice], partition_key=key, resources=cdc.resources, instance=instance)
    assert again.success
    # idempotent: the same window yields the same events (only the processing time ts_ms differs)
    assert pq.read_table(path).select(stable).to_pylist() == first
