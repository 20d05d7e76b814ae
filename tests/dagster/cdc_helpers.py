"""Helpers for the Dagster tests: a connector over a fresh database, its definitions and resources."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from dagster import AssetKey, AssetRecordsFilter, AssetsDefinition, DagsterInstance, Definitions, materialize
from pymongo.database import Database

from mongocdc_dagster.assets.cdc import CdcAssets, build_cdc_assets
from mongocdc_dagster.build import build_definitions
from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource
from mongocdc_dagster.settings import CdcSettings
from mongocdc_dagster.translator import MongoCdcTranslator


@dataclass
class CdcEnv:
    """One connector over a fresh database, with definitions built for the given collections."""

    db: Database[Any]
    settings: CdcSettings
    state: DiscoveryState
    cdc: CdcAssets
    defs: Definitions
    mongocdc: MongoCdcResource

    @property
    def resources(self) -> dict[str, Any]:
        return {"mongocdc": self.mongocdc, "kafka": MongoCdcKafkaResource()}

    def ns(self, coll: str) -> str:
        return f"{self.db.name}.{coll}"

    def key(self, coll: str, kind: str) -> AssetKey:
        """The key the translator gave one collection's output of ``kind``."""
        found = [s.key for s in self.defs.resolve_all_asset_specs()
                 if s.tags.get("mongocdc/kind") == kind and s.metadata.get("mongocdc/collection") == self.ns(coll)]
        assert len(found) == 1, f"no single {kind} asset for {self.ns(coll)}: {found}"
        return found[0]

    def materialize(self, instance: DagsterInstance, keys: Sequence[AssetKey], *, partition_key: str | None = None,
                    run_config: dict[str, Any] | None = None, raise_on_error: bool = True,
                    tags: dict[str, str] | None = None) -> Any:
        """Materialise a selection of the definitions' assets (their in-run checks included) in process."""
        assets = [a for a in self.defs.assets or [] if isinstance(a, AssetsDefinition)]
        return materialize(assets, selection=list(keys), partition_key=partition_key, resources=dict(self.defs.resources or {}),
                           instance=instance, run_config=run_config, raise_on_error=raise_on_error, tags=tags)


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


def make_env(tmp_path: Path, uri: str, db: Database[Any], collections: Sequence[str], granularity: str = "1min",
             start: str | None = "2026-01-01T00:00:00+00:00", ranged: dict[str, int] | None = None,
             translator: MongoCdcTranslator | None = None, tables: bool = True) -> CdcEnv:
    config = write_config(tmp_path / "connector.json", uri, db.name)
    settings = CdcSettings.resolve(connector_config=str(config), home=str(tmp_path / "home"),
                                   slice_granularity=granularity, slice_start=start, tables=tables,
                                   ranged_snapshots=ranged, environ={})
    state = DiscoveryState.of([f"{db.name}.{c}" for c in collections])
    translator = translator or MongoCdcTranslator()
    cdc = build_cdc_assets(settings, settings.load_config(), state, translator)
    defs = build_definitions(settings, state, translator)
    return CdcEnv(db, settings, state, cdc, defs, MongoCdcResource(config_path=str(config), home=str(settings.home)))


def materialization_metadata(instance: DagsterInstance, key: AssetKey, partition: str | None = None) -> dict[str, Any]:
    """The latest materialisation of `key` (of `partition` when given): its metadata as plain values."""
    event = instance.get_latest_materialization_event(key)
    assert event is not None and event.asset_materialization is not None
    if partition is not None:
        assert event.asset_materialization.partition == partition
    return {k: v.value for k, v in event.asset_materialization.metadata.items()}


def partition_metadata(instance: DagsterInstance, key: AssetKey, partition: str) -> dict[str, Any]:
    """The latest materialisation of one partition of `key`: its metadata as plain values."""
    records = instance.fetch_materializations(AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1)
    assert records.records, f"{key.to_user_string()} partition {partition} was never materialised"
    materialization = records.records[0].asset_materialization
    assert materialization is not None
    return {k: v.value for k, v in materialization.metadata.items()}


def checks_of(result: Any) -> dict[tuple[str, str], bool]:
    """(asset key, check name) -> passed, for a materialize() result."""
    return {(e.asset_key.to_user_string(), e.check_name): e.passed for e in result.get_asset_check_evaluations()}
