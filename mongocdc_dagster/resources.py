"""Dagster resources: the CDC engine, the optional Kafka sink, and Spark.

Like dagster-sling's ``SlingResource``, ``MongoCdcResource`` is the one place assets, sensors and checks
reach the engine through, so a test or a deployment swaps the connector by swapping the resource.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from dagster import ConfigurableResource
from dagster_pyspark import PySparkResource
from pydantic import Field
from pymongo import MongoClient

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.sinks.base import Sink
from mongocdc_core.source.connection import open_client
from mongocdc_dagster.settings import CdcSettings


class MongoCdcResource(ConfigurableResource):  # type: ignore[misc]
    """The connector named by a `mongocdc run` config file, with its landing zone under `home`."""

    config_path: str = Field(description="Debezium connector config (JSON or .properties), as `mongocdc run` takes")
    home: str = Field(description="MONGOCDC_HOME: landing zone, tables and local state")
    mongodb_password: str | None = Field(
        default=None, description="Overrides mongodb.password; set it through EnvVar, never in code"
    )

    def load_config(self) -> ConnectorConfig:
        """The validated connector config, with the secret applied."""
        cfg = ConnectorConfig.load(self.config_path)
        if self.mongodb_password:
            cfg = cfg.with_properties({"mongodb.password": self.mongodb_password})
        return cfg

    @property
    def landing_dir(self) -> Path:
        return Path(self.home) / "landing"

    def snapshot_path(self, namespace: str, name: str) -> Path:
        """Where one snapshot partition's single Parquet file lives."""
        return self.landing_dir / "snapshot" / namespace / f"{name}.parquet"

    def incremental_snapshot_path(self, namespace: str, name: str) -> Path:
        """Where one incremental snapshot partition's single Parquet file lives."""
        return self.landing_dir / "incremental_snapshot" / namespace / f"{name}.parquet"

    def slice_path(self, namespace: str, window_start: datetime) -> Path:
        """Where one stream slice's single Parquet file lives (no ':' so Hadoop paths accept it)."""
        return self.landing_dir / "stream_slice" / namespace / f"{window_start.strftime('%Y%m%dT%H%M%SZ')}.parquet"

    def client(self) -> MongoClient[Any]:
        """A MongoClient built from the connector config (caller closes it)."""
        return open_client(self.load_config())

    def captured_collections(self, cfg: ConnectorConfig | None = None) -> list[str]:
        """Captured `db.collection` names, without the signaling collection (it is not data)."""
        cfg = cfg or self.load_config()
        return [
            ns for ns in api.list_captured_collections(cfg) if not cfg.is_signal_collection(*ns.split(".", 1))
        ]

    def oplog_window(self) -> api.OplogWindow:
        return api.oplog_window(self.load_config())


class MongoCdcKafkaResource(ConfigurableResource):  # type: ignore[misc]
    """Optional Kafka delivery next to the landing zone (the `kafka:HOST:PORT` sink of `mongocdc run`)."""

    bootstrap_servers: str | None = Field(default=None, description="HOST:PORT; unset means no Kafka delivery")

    @property
    def enabled(self) -> bool:
        return bool(self.bootstrap_servers)

    def open_sink(self, cfg: ConnectorConfig) -> Sink:
        """The engine's Kafka sink for this connector's topics."""
        from mongocdc_core.sinks.factory import open_sink

        if not self.bootstrap_servers:
            raise ValueError("the kafka resource has no bootstrap_servers; set MONGOCDC_KAFKA_BOOTSTRAP")
        return open_sink(f"kafka:{self.bootstrap_servers}", cfg)


def build_pyspark_resource(settings: CdcSettings, master: str) -> PySparkResource:
    """Local-mode Spark by default; the same assets run on a cluster by changing `master`."""
    from mongocdc_core.tables import spark_conf

    return PySparkResource(
        spark_config={
            **spark_conf(local_tuning=master.startswith("local")),
            "spark.master": master,
            "spark.app.name": "mongocdc",
            "spark.sql.warehouse.dir": str(settings.home / "spark-warehouse"),
        }
    )
