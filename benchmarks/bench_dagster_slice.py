"""Dagster slices: a 24-window backfill as one run vs 24 runs, and a slice run vs `mongocdc run` on one window.

An in-process emulator whose cluster clock starts an hour in the past (``tests/dagster/time_travel.py``)
gets N orders changes in each of 24 one-minute windows, so all 24 are closed history at once. Then, on
an ephemeral Dagster instance:

1. the slices of the 24 windows as ONE run (``BackfillPolicy.single_run``: one change stream, one file
   per window) vs 24 runs of one window each; the ratio is how much faster the single run is;
2. one window as a slice run (``materialize`` of one partition) vs ``mongocdc run`` (the CLI's entry
   point, in this process) streaming the same window into a Parquet sink from an offset at the window's
   start (``--stop-at`` its end); the ratio is the slice run's events/s over the connector's.

Usage: ``python -m benchmarks.bench_dagster_slice`` (2,000 changes per window; ``MONGOCDC_BENCH_SMALL=1``: 200).
"""

from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
from dagster import AssetsDefinition, DagsterInstance, materialize
from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG
from pymongo import MongoClient

from benchmarks import harness
from mongocdc_core import run_command
from mongocdc_core.offsets import FileOffsetStore, Offset
from mongocdc_core.positions import Position, token_timestamp
from mongocdc_dagster.build import build_definitions
from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.partitions import floor_to
from mongocdc_dagster.settings import CdcSettings
from tests.dagster.time_travel import travelling_replica_set

WINDOWS = 24
FMT = "%Y-%m-%d-%H:%M"


def _slices(defs: Any, instance: DagsterInstance, key: Any, tags: dict[str, str] | None = None,
            partition: str | None = None) -> None:
    assets = [a for a in defs.assets or [] if isinstance(a, AssetsDefinition)]
    result = materialize(assets, selection=[key], resources=dict(defs.resources or {}), instance=instance,
                         partition_key=partition, tags=tags)
    assert result.success


NAME = "dagster slices"
BASELINE = "24 runs of one window each (backfill); `mongocdc run` streaming the same window into Parquet (one slice)"


def run(small: bool) -> list[harness.Row]:
    per_window = 200 if small else 2000
    with travelling_replica_set(behind_s=3600) as (uri, clock), tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        client: MongoClient[dict[str, Any]] = MongoClient(uri)
        db = client["bench"]
        first = floor_to(clock.now(), 60) + timedelta(minutes=1)
        tokens: list[dict[str, Any]] = []
        with db.watch() as stream:
            for minute in range(WINDOWS):
                clock.jump_to(first + timedelta(minutes=minute, seconds=1))
                db.other.insert_one({"_id": f"tick-{minute}"})  # the resume point of `mongocdc run` for this window
                while stream.try_next() is not None:
                    pass
                assert stream.resume_token is not None
                tokens.append(dict(stream.resume_token))
                db.orders.insert_many([{"_id": f"{minute}-{i}", "qty": i, "pad": "x" * 200} for i in range(per_window)])
        clock.jump_to(first + timedelta(minutes=WINDOWS, seconds=2))
        db.other.insert_one({"_id": "after"})
        config = home / "connector.json"
        config.write_bytes(orjson.dumps({"name": "bench", "config": {
            "mongodb.connection.string": uri, "topic.prefix": "bench", "collection.include.list": r"bench\.orders",
            "snapshot.mode": "no_data"}}))
        settings = CdcSettings.resolve(connector_config=str(config), home=str(home / "cdc"), slice_granularity="1min",
                                       slice_start=first.isoformat(), tables=False, environ={})
        defs = build_definitions(settings, DiscoveryState.of(["bench.orders"]))
        key = next(s.key for s in defs.resolve_all_asset_specs() if s.tags.get("mongocdc/kind") == "slices")
        keys = [(first + timedelta(minutes=m)).strftime(FMT) for m in range(WINDOWS)]
        events = WINDOWS * per_window
        with DagsterInstance.ephemeral() as instance:
            _slices(defs, instance, key, partition=keys[0])  # warm-up: imports, first connection
            started = time.perf_counter()
            _slices(defs, instance, key, tags={ASSET_PARTITION_RANGE_START_TAG: keys[0],
                                               ASSET_PARTITION_RANGE_END_TAG: keys[-1]})
            one_run = time.perf_counter() - started
            started = time.perf_counter()
            for k in keys:
                _slices(defs, instance, key, partition=k)
            many_runs = time.perf_counter() - started
            window = keys[WINDOWS // 2]
            started = time.perf_counter()
            _slices(defs, instance, key, partition=window)
            slice_run = time.perf_counter() - started
        index = WINDOWS // 2
        offsets = home / "offsets.json"
        ts = token_timestamp(tokens[index])
        assert ts is not None
        FileOffsetStore(offsets).save(Offset(resume_token=tokens[index], position=Position.from_timestamp(ts)))
        end = int((first + timedelta(minutes=index + 1)).timestamp())
        started = time.perf_counter()
        code = run_command.main(["--config", str(config), "--sink", f"parquet:{home / 'run'}", "--offsets", str(offsets),
                            "--stop-at", f"{end}:0", "--no-progress", "--log-level", "WARNING"])
        connector = time.perf_counter() - started
        assert code == 0, f"mongocdc run exited {code}"
        client.close()
    return [
        harness.Row(NAME, f"{WINDOWS}-window backfill as one run ({per_window:,} changes per window)",
                    f"the same {WINDOWS} windows as {WINDOWS} runs", events / one_run, events / many_runs, "events/s",
                    many_runs / one_run),
        harness.Row(NAME, "one window as a slice run", "`mongocdc run` streaming the same window into Parquet",
                    per_window / slice_run, per_window / connector, "events/s", connector / slice_run),
    ]


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
