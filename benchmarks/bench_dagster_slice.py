"""What a Dagster run costs around a stream slice: events/s through `materialize` vs the engine alone.

Starts the emulator as a separate process, waits for a one-minute window that lies wholly inside its
oplog, writes N documents into it, and once the window has closed reads it in this process, best of three each after a warm-up pass: the
baseline ``api.stream_window`` into a ``ParquetSink.to_file`` (exactly what the asset does inside),
then the ``stream_slice`` asset through ``dagster.materialize`` on an ephemeral instance. The ratio
(Dagster events/s over engine events/s) is the fraction of the engine's speed left after Dagster's
run overhead and the asset's landing check; it approaches 1 as slices grow.

Usage: ``python -m benchmarks.bench_dagster_slice`` (``MONGOCDC_BENCH_SMALL=1``: 500 documents)
"""

from __future__ import annotations

import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
from bson import Timestamp
from dagster import DagsterInstance, materialize
from pymongo import MongoClient
from rich.console import Console

from benchmarks import harness
from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_dagster.assets.cdc import build_cdc_assets
from mongocdc_dagster.partitions import COLLECTIONS_PARTITIONS_NAME, CdcPartitions
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource
from mongocdc_dagster.settings import CdcSettings
from mongocdc_devstack.fixture import EmulatedReplicaSet

ROUNDS = 3  # best of three for each path: the change stream's polling makes single runs noisy


def _sleep_until(when: datetime) -> None:
    delay = (when - datetime.now(UTC)).total_seconds()
    if delay > 0:
        time.sleep(delay)


NAME = "dagster slice"
BASELINE = "api.stream_window of the same window into a ParquetSink.to_file (what the asset runs inside), best of 3"


def run(small: bool) -> list[harness.Row]:
    events = 500 if small else 20_000
    console = Console()
    with EmulatedReplicaSet(in_process=False, noop_interval=1.0) as emulator, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        config = home / "connector.json"
        config.write_bytes(orjson.dumps({"name": "bench", "config": {
            "mongodb.connection.string": emulator.uri, "topic.prefix": "bench", "database.include.list": "bench"}}))
        cfg = ConnectorConfig.load(config)
        first = datetime.fromtimestamp(api.oplog_window(cfg).first.time, UTC)
        settings = CdcSettings.from_env({"MONGOCDC_CONFIG": str(config), "MONGOCDC_HOME": str(home),
                                         "MONGOCDC_SLICE_GRANULARITY": "1min",
                                         "MONGOCDC_SLICE_START": first.replace(second=0, microsecond=0).isoformat()})
        partitions = CdcPartitions.from_settings(settings)
        window_start = partitions.window(partitions.window_key_containing(first) or "").end
        console.print(f"waiting for the window starting {window_start:%H:%M:%S} (inside the oplog)")
        _sleep_until(window_start)
        client: MongoClient[dict[str, object]] = MongoClient(emulator.uri)
        docs = [{"_id": i, "name": f"customer-{i}", "value": i * 3, "tags": ["a", "b"]} for i in range(events)]
        for offset in range(0, len(docs), 1000):
            client.bench.orders.insert_many(docs[offset:offset + 1000])
        client.close()
        window_key = partitions.window_key_containing(window_start)
        assert window_key is not None
        window = partitions.window(window_key)
        _sleep_until(window.end)
        time.sleep(1.5)  # the emulator's no-op entry moves the cluster time past the window end

        start, end = Timestamp(int(window.start.timestamp()), 0), Timestamp(int(window.end.timestamp()), 0)
        direct_s = dagster_s = float("inf")
        for attempt in range(ROUNDS + 1):  # the first pass warms the emulator's caches and is not counted
            began = time.perf_counter()
            sink = ParquetSink.to_file(home / "baseline.parquet")
            direct = api.stream_window(cfg, "bench.orders", start, end, sink)
            sink.close()
            if attempt:
                direct_s = min(direct_s, time.perf_counter() - began)

        assets = build_cdc_assets(cfg, settings.landing_dir, partitions)
        resources = {"mongocdc": MongoCdcResource(config_path=str(config), home=str(home)),
                     "kafka": MongoCdcKafkaResource()}
        with DagsterInstance.ephemeral() as instance:
            instance.add_dynamic_partitions(COLLECTIONS_PARTITIONS_NAME, ["bench.orders"])
            for _ in range(ROUNDS):
                began = time.perf_counter()
                result = materialize([assets.stream_slice],
                                     partition_key=str(partitions.slice_key("bench.orders", window_key)),
                                     resources=resources, instance=instance)
                dagster_s = min(dagster_s, time.perf_counter() - began)
        assert result.success and direct.events == events, (direct.events, events)

    return [harness.Row(NAME, f"stream slice of {direct.events:,} events through dagster materialize", BASELINE,
                        direct.events / dagster_s, direct.events / direct_s, "events/s", direct_s / dagster_s)]


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
