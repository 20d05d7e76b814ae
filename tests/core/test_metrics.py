"""Metrics a monitoring system can scrape: Prometheus over HTTP, the JSON file, and the tags."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pymongo.database import Database

from mongocdc_core.config import ConfigError, ConnectorConfig
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.metrics.prometheus import PrometheusExporter
from mongocdc_core.positions import Position

BASE = {"mongodb.connection.string": "mongodb://h/?replicaSet=rs0", "topic.prefix": "shop"}


def _busy_metrics(tags: dict[str, str] | None = None) -> ConnectorMetrics:
    metrics = ConnectorMetrics("shop", tags)
    metrics.snapshot.start(["inv.orders", "inv.customers"])
    metrics.snapshot.rows("inv.orders", 7, "r1")
    metrics.snapshot.rows("inv.customers", 3, "r2")
    metrics.snapshot.table_done()
    metrics.snapshot.table_done()
    metrics.snapshot.finish(aborted=False)
    metrics.streaming.seen({"c": 2, "u": 1}, Position(4, 1), 900, None)
    metrics.streaming.seen({"d": 1}, Position(5, 1), 1_000, None)
    metrics.streaming.filtered(2)
    metrics.streaming.Connected = True
    return metrics


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _labels(context: str, **extra: str) -> tuple[tuple[str, str], ...]:
    labels = {"plugin": "mongodb", "server": "shop", "task": "0", "context": context}
    return tuple(sorted({**labels, **extra}.items()))


def test_prometheus_exporter_serves_debezium_names_and_labels_over_http() -> None:
    cfg = ConnectorConfig({**BASE, "custom.metric.tags": "env=prod, team=data"})
    metrics = _busy_metrics(cfg.custom_metric_tags)
    with PrometheusExporter(metrics, 0, addr="127.0.0.1") as exporter:
        samples = _scrape(exporter.port)
        tags = {"env": "prod", "team": "data"}
        assert samples[("debezium_metrics_TotalNumberOfEventsSeen", _labels("streaming", **tags))] == 4
        assert samples[("debezium_metrics_TotalNumberOfCreateEventsSeen", _labels("streaming", **tags))] == 2
        assert samples[("debezium_metrics_NumberOfEventsFiltered", _labels("streaming", **tags))] == 2
        assert samples[("debezium_metrics_Connected", _labels("streaming", **tags))] == 1
        assert samples[("debezium_metrics_TotalNumberOfEventsSeen", _labels("snapshot", **tags))] == 10
        assert samples[("debezium_metrics_SnapshotCompleted", _labels("snapshot", **tags))] == 1
        assert samples[("debezium_metrics_RemainingTableCount", _labels("snapshot", **tags))] == 0
        assert samples[("debezium_metrics_RowsScanned", _labels("snapshot", table="inv.orders", **tags))] == 7
        # Values are read at scrape time: a later event shows in the next scrape.
        metrics.streaming.seen({"u": 1}, Position(6, 1), 2_000, None)
        assert _scrape(exporter.port)[("debezium_metrics_TotalNumberOfEventsSeen", _labels("streaming", **tags))] == 5
        port = exporter.port
    with pytest.raises(OSError):  # stopped: the port is closed
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_exporter_names_a_port_it_cannot_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            PrometheusExporter(ConnectorMetrics("shop"), port, addr="127.0.0.1").start()


def test_json_file_exporter_writes_the_same_values(tmp_path: Path) -> None:
    cfg = ConnectorConfig({**BASE, "custom.metric.tags": "env=prod, team=data"})
    metrics = _busy_metrics(cfg.custom_metric_tags)
    path = tmp_path / "m" / "metrics.json"
    metrics.start_file_writer(path, interval_s=60)
    metrics.streaming.seen({"c": 1}, Position(7, 1), 3_000, None)
    metrics.stop_file_writer(path)
    data = orjson.loads(path.read_bytes())
    # The tags are appended to the MBean name, as Debezium does and as the Prometheus labels carry them.
    assert sorted(data) == [
        "debezium.mongodb:type=connector-metrics,context=snapshot,server=shop,task=0,env=prod,team=data",
        "debezium.mongodb:type=connector-metrics,context=streaming,server=shop,task=0,env=prod,team=data",
    ]
    streaming = data["debezium.mongodb:type=connector-metrics,context=streaming,server=shop,task=0,env=prod,team=data"]
    assert streaming["TotalNumberOfEventsSeen"] == 5 and streaming["TotalNumberOfCreateEventsSeen"] == 3
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


@pytest.mark.parametrize(("tags", "reason"), [
    ("env", "expected key=value pairs"),
    ("env=", "expected key=value pairs"),
    ("=prod", "expected key=value pairs"),
    ("a=1,,b=2", "expected key=value pairs"),
    ("a=1,a=2", "given twice"),
    ("1env=prod", "must start with a letter"),
    ("context=x", "set by the connector itself"),
    ("k=v=w", "expected key=value pairs"),
])
def test_malformed_custom_metric_tags_are_refused(tags: str, reason: str) -> None:
    with pytest.raises(ConfigError) as info:
        ConnectorConfig({**BASE, "custom.metric.tags": tags})
    assert info.value.properties == ("custom.metric.tags",) and reason in str(info.value)


def test_metrics_port_property() -> None:
    assert ConnectorConfig(BASE).mongocdc_metrics_port == 0
    assert ConnectorConfig({**BASE, "mongocdc.metrics.port": "9404"}).mongocdc_metrics_port == 9404
    with pytest.raises(ConfigError, match="mongocdc.metrics.port: must be <= 65535"):
        ConnectorConfig({**BASE, "mongocdc.metrics.port": "70000"})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_mongocdc_run_serves_metrics_while_it_streams(tmp_path: Path, mongo_uri: str, fresh_db: Database[Any]) -> None:
    fresh_db.items.insert_one({"_id": 0})
    port = _free_port()
    config = tmp_path / "connector.properties"
    config.write_text(
        f"mongodb.connection.string={mongo_uri}\ntopic.prefix=scrape\ncollection.include.list={fresh_db.name}\\..*\n"
        f"mongocdc.metrics.port={port}\ncustom.metric.tags=env=test\n"
    )
    args = ["run", "--config", str(config), "--sink", f"jsonl:{tmp_path / 'out'}",
            "--offsets", str(tmp_path / "offsets.json"), "--no-progress", "--metrics-file", str(tmp_path / "m.json")]
    proc = subprocess.Popen([sys.executable, "-m", "mongocdc_core.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and "streaming" in proc.stdout.readline()
        fresh_db.items.insert_many([{"_id": i} for i in range(1, 4)])
        streaming = ("debezium_metrics_TotalNumberOfEventsSeen", _labels("streaming", env="test", server="scrape"))
        samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        deadline = time.monotonic() + 60  # a guard against hanging, not the oracle: the counts are
        while time.monotonic() < deadline and samples.get(streaming, 0) < 3:
            try:
                samples = _scrape(port)
            except urllib.error.URLError:
                pass
            time.sleep(0.2)
        assert samples[streaming] == 3
        rows = ("debezium_metrics_RowsScanned",
                _labels("snapshot", env="test", server="scrape", table=f"{fresh_db.name}.items"))
        assert samples[rows] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    # The JSON file names the metrics with the same tags as the endpoint, and holds the same counts.
    written = orjson.loads((tmp_path / "m.json").read_bytes())
    streamed = written["debezium.mongodb:type=connector-metrics,context=streaming,server=scrape,task=0,env=test"]
    assert streamed["TotalNumberOfEventsSeen"] == 3
