"""Helpers for the Dagster tests: a connector config over a fresh database, its assets and resources."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from dagster import AssetKey, DagsterInstance
from pymongo.database import Database

from mongocdc_core.config import ConnectorConfig
from mongocdc_dagster.assets.cdc import CdcAssets, build_cdc_assets
from mongocdc_dagster.partitions import COLLECTIONS_PARTITIONS_NAME, CdcPartitions
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource
from mongocdc_dagster.settings import CdcSettings


@dataclass
class CdcEnv:
    """One connector over a fresh database, with its assets built and resources ready."""

    db: Database[Any]
    settings: CdcSettings
    partitions: CdcPartitions
    assets: CdcAssets
    mongocdc: MongoCdcResource
    signal_collection: str

    @property
    def resources(self) -> dict[str, Any]:
        return {"mongocdc": self.mongocdc, "kafka": MongoCdcKafkaResource()}

    def ns(self, coll: str) -> str:
        return f"{self.db.name}.{coll}"


def write_config(path: Path, uri: str, db: str) -> Path:
    path.write_bytes(orjson.dumps({
        "name": "test-connector",
        "config": {
            "mongodb.connection.string": uri,
            "topic.prefix": "testsrv",
            "database.include.list": db,
            "signal.data.collection": f"{db}.signals",
        },
    }))
    return path


def make_env(tmp_path: Path, uri: str, db: Database[Any], granularity: str = "1min",
             start: str = "2026-01-01T00:00:00+00:00") -> CdcEnv:
    config = write_config(tmp_path / "connector.json", uri, db.name)
    settings = CdcSettings.from_env({
        "MONGOCDC_CONFIG": str(config), "MONGOCDC_HOME": str(tmp_path / "home"),
        "MONGOCDC_SLICE_GRANULARITY": granularity, "MONGOCDC_SLICE_START": start,
    })
    partitions = CdcPartitions.from_settings(settings)
    assets = build_cdc_assets(ConnectorConfig.load(config), settings.landing_dir, partitions)
    resource = MongoCdcResource(config_path=str(config), home=str(settings.home))
    return CdcEnv(db, settings, partitions, assets, resource, f"{db.name}.signals")


def register(instance: DagsterInstance, *namespaces: str) -> None:
    instance.add_dynamic_partitions(COLLECTIONS_PARTITIONS_NAME, list(namespaces))


def materialization_metadata(instance: DagsterInstance, key: AssetKey, partition: str) -> dict[str, Any]:
    """The latest materialisation of `key`: it must be of `partition`; its metadata as plain values."""
    event = instance.get_latest_materialization_event(key)
    assert event is not None and event.asset_materialization is not None
    assert event.asset_materialization.partition == partition
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def checks_of(result: Any) -> dict[str, bool]:
    """Asset check name -> passed, for a materialize() result."""
    return {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
