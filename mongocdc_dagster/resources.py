"""Dagster resources: the capture pipeline, the optional Kafka sink, and Spark.

Like dagster-sling's ``SlingResource``, ``MongoCdcResource`` is the one place assets, sensors and checks
reach the engine through, so a test or a deployment swaps the connector by swapping the resource. It
also owns the landing zone's layout (one file per partition).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bson import Timestamp
from dagster import ConfigurableResource, InitResourceContext
from dagster_pyspark import PySparkResource
from pydantic import Field
from pymongo import MongoClient

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.receiver import ProgressListener
from mongocdc_core.sinks.base import Sink
from mongocdc_core.source.connection import open_client
from mongocdc_core.source.ranges import IdRange
from mongocdc_dagster.settings import ENV_PASSWORD, CdcSettings

SNAPSHOT_FILE = "snapshot"
RANGES_PREFIX = "ranges-"
PLAN_FILE = "plan.json"
R = TypeVar("R")


class MongoCdcResource(ConfigurableResource):  # type: ignore[misc]
    """The connector named by a config file (or inline properties), with its landing zone under ``home``."""

    config_path: str | None = Field(
        default=None, description="Debezium connector config (JSON or .properties), as `mongocdc run` takes")
    connector_properties: dict[str, str] | None = Field(
        default=None, description="the connector's Debezium properties inline (instead of config_path)")
    home: str = Field(description="landing zone, tables and local state")
    mongodb_password: str | None = Field(
        default=None, description="Overrides mongodb.password; set it through EnvVar, never in code"
    )

    @classmethod
    def from_settings(cls, settings: CdcSettings, password: Any = None) -> MongoCdcResource:
        return cls(
            config_path=str(settings.config_path) if settings.config_path is not None else None,
            connector_properties=dict(settings.properties) if settings.properties is not None else None,
            home=str(settings.home),
            mongodb_password=password,
        )

    @classmethod
    def for_load(cls, settings: CdcSettings) -> MongoCdcResource:
        """The resource a definitions load discovers with, outside any run: the password secret is read from
        ``MONGOCDC_MONGODB_PASSWORD`` now (a run's resource reads it through ``EnvVar``)."""
        return cls.from_settings(settings, os.environ.get(ENV_PASSWORD) or None)

    def load_config(self) -> ConnectorConfig:
        """The validated connector config, with the secret applied."""
        if self.connector_properties is not None:
            cfg = ConnectorConfig.from_dict(self.connector_properties)
        elif self.config_path is not None:
            cfg = ConnectorConfig.load(self.config_path)
        else:
            raise ValueError("the mongocdc resource needs config_path or connector_properties")
        if self.mongodb_password:
            cfg = cfg.with_properties({"mongodb.password": self.mongodb_password})
        return cfg

    @property
    def describe(self) -> str:
        """How the connector was named, for messages."""
        return self.config_path or "the inline connector_properties"

    # -- the landing zone ------------------------------------------------------------------------------

    @property
    def landing_dir(self) -> Path:
        return Path(self.home) / "landing"

    def snapshot_dir(self, namespace: str) -> Path:
        return self.landing_dir / "snapshot" / namespace

    def snapshot_path(self, namespace: str, name: str = SNAPSHOT_FILE) -> Path:
        """Where one snapshot's single Parquet file lives (``snapshot`` or ``filtered-<hash>``)."""
        return self.snapshot_dir(namespace) / f"{name}.parquet"

    def ranges_dir(self, namespace: str, plan: str) -> Path:
        """The folder of one range plan: ``plan.json`` and one file per range."""
        return self.snapshot_dir(namespace) / f"{RANGES_PREFIX}{plan}"

    def range_path(self, namespace: str, plan: str, index: int, count: int) -> Path:
        return self.ranges_dir(namespace, plan) / f"range-{index:05d}-of-{count:05d}.parquet"

    def incremental_snapshot_path(self, namespace: str, name: str = SNAPSHOT_FILE) -> Path:
        return self.landing_dir / "incremental_snapshot" / namespace / f"{name}.parquet"

    def slice_path(self, namespace: str, window_start: datetime) -> Path:
        """Where one window's single Parquet file lives (no ':' so Hadoop paths accept it)."""
        return self.landing_dir / "stream_slice" / namespace / f"{window_start.strftime('%Y%m%dT%H%M%SZ')}.parquet"

    def landing_files(self, namespace: str) -> list[str]:
        """Every landing file of one collection (snapshots, range files, incremental snapshots, slices)."""
        folders = [self.landing_dir / kind / namespace for kind in ("snapshot", "incremental_snapshot", "stream_slice")]
        return sorted(str(p.resolve()) for folder in folders if folder.is_dir()
                      for p in folder.rglob("*.parquet") if not p.name.startswith("."))

    # -- MongoDB ---------------------------------------------------------------------------------------

    def client(self) -> MongoClient[Any]:
        """A MongoClient built from the connector config (caller closes it)."""
        return open_client(self.load_config())

    def captured_collections(self, cfg: ConnectorConfig | None = None) -> list[str]:
        """Captured ``db.collection`` names (the signaling collection is not data)."""
        return api.list_captured_collections(cfg or self.load_config())

    def oplog_window(self, cfg: ConnectorConfig | None = None) -> api.OplogWindow:
        return api.oplog_window(cfg or self.load_config())

    def oplog_windows(self) -> api.OplogWindows:
        """The replica set's oplog window, or each shard's."""
        return api.oplog_windows(self.load_config())

    def estimated_counts(self, namespaces: Sequence[str], cfg: ConnectorConfig | None = None) -> dict[str, int | None]:
        return api.estimated_counts(cfg or self.load_config(), namespaces)

    def cluster_time(self, cfg: ConnectorConfig | None = None) -> Timestamp:
        """The deployment's current clusterTime."""
        return api.current_cluster_time(cfg or self.load_config())

    def read_signals(self, cfg: ConnectorConfig, *, resume_after: dict[str, Any] | None = None,
                     start_at: Timestamp | None = None, limit: int = 100) -> api.SignalRead:
        """Signals inserted after a resume token (or from ``start_at``, else from now), in insert order."""
        return api.read_signals(cfg, resume_after=resume_after, start_at=start_at, limit=limit)

    def plan_ranges(self, namespace: str, split_size: int) -> list[IdRange]:
        """The collection's ``_id`` ranges of about ``split_size`` documents."""
        return api.plan_snapshot_ranges(self.load_config(), namespace, split_size)

    # -- capture -----------------------------------------------------------------------------------------

    def snapshot(self, cfg: ConnectorConfig, namespace: str, sink: Sink, *, filter: dict[str, Any] | None,  # noqa: A002
                 id_range: IdRange | None = None, metrics: ConnectorMetrics, progress: ProgressListener,
                 ) -> api.SnapshotResult:
        """A blocking snapshot of one collection (or one ``_id`` range of it) into ``sink``."""
        return api.snapshot_collection(cfg, namespace, sink, filter=filter, id_range=id_range, metrics=metrics,
                                       progress=progress)

    def incremental_snapshot(self, cfg: ConnectorConfig, namespace: str, sink: Sink, *,
                             filter: dict[str, Any] | None, metrics: ConnectorMetrics,  # noqa: A002
                             progress: ProgressListener) -> api.IncrementalSnapshotResult:
        """An incremental snapshot of one collection, with the changes streamed while it ran, into ``sink``."""
        return api.incremental_snapshot_collection(cfg, namespace, sink, filter=filter, metrics=metrics,
                                                   progress=progress)

    def stream_window(self, cfg: ConnectorConfig, namespaces: Sequence[str], start: Timestamp, end: Timestamp,
                      sink: Sink, *, metrics: ConnectorMetrics | None = None,
                      progress: ProgressListener | None = None) -> api.SliceResult:
        """The change events of ``namespaces`` in clusterTime window ``[start, end)``, from one change stream."""
        single = namespaces[0] if len(namespaces) == 1 else None
        return api.stream_window(cfg, single, start, end, sink, only=None if single else namespaces,
                                 metrics=metrics, progress=progress)


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
            raise ValueError("the kafka resource has no bootstrap_servers; set kafka_bootstrap (MONGOCDC_KAFKA_BOOTSTRAP)")
        return open_sink(f"kafka:{self.bootstrap_servers}", cfg)


class MongoCdcPySparkResource(PySparkResource):  # type: ignore[misc]
    """dagster-pyspark's resource, its session started as :func:`mongocdc_core.tables.session.start_session`
    starts one: the driver from an ahead-of-time cache on Java 25 and newer, chosen as the run starts its
    session (not when the code location loads), and a :class:`SparkSetupError` naming why it could not."""

    def setup_for_execution(self, context: InitResourceContext) -> None:
        from mongocdc_core.tables.session import start_session

        self._spark_session = start_session({key: str(value) for key, value in self.spark_config.items()})


def build_pyspark_resource(settings: CdcSettings) -> PySparkResource:
    """Local-mode Spark by default; the same assets run on a cluster by changing ``spark_master``."""
    from mongocdc_core.tables import spark_conf

    master = settings.spark_master
    return MongoCdcPySparkResource(
        spark_config={
            **spark_conf(local_tuning=master.startswith("local")),
            "spark.master": master,
            "spark.app.name": "mongocdc",
            "spark.sql.warehouse.dir": str(settings.home / "spark-warehouse"),
        }
    )


class HasResources(Protocol):
    """A Dagster context (asset, op, check, sensor) with the resources its definition requires."""

    @property
    def resources(self) -> object: ...


def resource_of(context: HasResources, key: str, kind: type[R]) -> R:
    """The resource a definition requires under ``key``: keys carry the connector's name (see
    :mod:`mongocdc_dagster.naming`), so definitions ask by key rather than by parameter name."""
    resource = getattr(context.resources, key)
    if not isinstance(resource, kind):
        raise TypeError(f"the resource {key!r} is a {type(resource).__name__}, not a {kind.__name__}")
    return resource
