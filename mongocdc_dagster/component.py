"""``MongoCdcComponent``: one connector's assets, checks, sensors and schedules from a ``defs.yaml``.

.. code-block:: yaml

    type: mongocdc_dagster.MongoCdcComponent
    attributes:
      connector_config: connector.json      # or connector_properties: {mongodb.connection.string: ..., ...}
      home: /data/mongocdc                  # landing zone and tables
      slice_granularity: hourly             # hourly, daily or <N>min
      tables: true                          # the Spark/Delta changelog and current_state assets
      spark_master: local[2]
      translation:                          # optional: any asset attribute, templated per output
        group_name: "cdc_{{ props.database }}"

Collections are discovered from MongoDB with the connector's filters and kept as defs state
(``LEGACY_CODE_SERVER_SNAPSHOTS`` by default: discovered when the code server starts or reloads, handed
to run workers without asking MongoDB again). Attributes left out fall back to ``MONGOCDC_*``
environment variables, then to the local stack of ``make dev``. ``dg scaffold defs
mongocdc_dagster.MongoCdcComponent <path>`` writes a defs.yaml to start from.

No ``from __future__ import annotations``: the component's attributes are resolved from its annotations.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from dagster import AssetSpec, ComponentLoadContext, Definitions, Resolvable, StateBackedComponent
from dagster.components import DefsStateConfig, DefsStateConfigArgs, ResolvedDefsStateConfig
from dagster.components.scaffold.scaffold import Scaffolder, ScaffoldRequest, scaffold_with
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import BaseModel

from mongocdc_dagster.build import build_definitions
from mongocdc_dagster.discovery import DiscoveryState, discover
from mongocdc_dagster.settings import ENV_CONFIG, CdcSettings
from mongocdc_dagster.translator import MongoCdcAssetProps, MongoCdcTranslator

SCAFFOLD_ATTRIBUTES: dict[str, Any] = {
    "connector_config": "connector.json",
    "home": ".mongocdc",
    "slice_granularity": "hourly",
    "tables": True,
    "spark_master": "local[2]",
}


class MongoCdcScaffolder(Scaffolder[BaseModel]):
    """``dg scaffold defs mongocdc_dagster.MongoCdcComponent <path>``: a defs.yaml and a connector config."""

    def scaffold(self, request: ScaffoldRequest[BaseModel]) -> None:
        from dagster.components.component_scaffolding import scaffold_component

        scaffold_component(request, SCAFFOLD_ATTRIBUTES)
        config = request.target_path / "connector.json"
        if not config.exists():
            config.write_text(
                '{\n  "name": "my-connector",\n  "config": {\n'
                '    "mongodb.connection.string": "mongodb://127.0.0.1:27017/?replicaSet=rs0",\n'
                '    "topic.prefix": "dbserver1",\n'
                '    "collection.include.list": "inventory\\\\..*",\n'
                '    "signal.data.collection": "inventory.debezium_signal"\n  }\n}\n'
            )


def _translation_scope(props: MongoCdcAssetProps) -> Mapping[str, Any]:
    return {"props": props, "kind": props.kind, "namespace": props.namespace, "database": props.database,
            "collection": props.collection}


class _ComponentTranslator(MongoCdcTranslator):
    """Defers to the component's ``get_asset_spec`` (which applies its ``translation``)."""

    def __init__(self, component: "MongoCdcComponent") -> None:
        self.component = component

    def get_asset_spec(self, props: MongoCdcAssetProps) -> AssetSpec:
        return self.component.get_asset_spec(props)

    def base_asset_spec(self, props: MongoCdcAssetProps) -> AssetSpec:
        return super().get_asset_spec(props)


@scaffold_with(MongoCdcScaffolder)
@dataclass
class MongoCdcComponent(StateBackedComponent, Resolvable):
    """A mongocdc connector in Dagster: one asset per captured collection and kind (snapshot,
    incremental_snapshot, slices by time window, and the Delta changelog and current_state tables),
    with asset checks, sensors (signals, oplog window, discovery) and schedules.

    Every attribute is optional: unset ones come from MONGOCDC_* environment variables, then from the
    local development stack.
    """

    connector_config: str | None = None
    """The Debezium connector config file (JSON or .properties), relative to this defs.yaml."""
    connector_properties: dict[str, str] | None = None
    """The connector's Debezium properties inline (instead of connector_config)."""
    home: str | None = None
    """Landing zone and tables (relative to this defs.yaml)."""
    slice_granularity: str | None = None
    """Stream slice windows: hourly, daily or <N>min (N dividing 60)."""
    slice_start: str | None = None
    """First window (ISO date-time); unset: where the oplog starts (at most 2000 windows back)."""
    sensor_interval_seconds: int | None = None
    kafka_bootstrap: str | None = None
    """Also deliver snapshot and slice records to this Kafka cluster (HOST:PORT)."""
    tables: bool | None = None
    """Build the Spark/Delta changelog and current_state assets (default true)."""
    spark_master: str | None = None
    """Spark master of the pyspark resource (local[2], spark://host:7077, ...)."""
    ranged_snapshots: dict[str, int] | None = None
    """'<db>.<collection>' -> documents per _id range: its snapshot is one partition per range."""
    translation: Annotated[
        TranslationFn[MongoCdcAssetProps],
        TranslationFnResolver[MongoCdcAssetProps](template_vars_for_translation_fn=_translation_scope),
    ] | None = None
    """Asset attributes per output, templated with props, kind, namespace, database, collection."""
    defs_state: ResolvedDefsStateConfig = field(default_factory=DefsStateConfigArgs.legacy_code_server_snapshots)

    def settings(self, base_dir: Path | None = None) -> CdcSettings:
        return CdcSettings.resolve(
            connector_config=self.connector_config, connector_properties=self.connector_properties, home=self.home,
            slice_granularity=self.slice_granularity, slice_start=self.slice_start,
            sensor_interval_seconds=self.sensor_interval_seconds, kafka_bootstrap=self.kafka_bootstrap,
            tables=self.tables, spark_master=self.spark_master, ranged_snapshots=self.ranged_snapshots,
            base_dir=base_dir or getattr(self, "_base_dir", None),
        )

    @property
    def defs_state_config(self) -> DefsStateConfig:
        # the attributes as written (not resolved paths): the key must be the same in every process
        name = self.connector_config or ("inline properties" if self.connector_properties else
                                         os.environ.get(ENV_CONFIG, "local stack"))
        return DefsStateConfig.from_args(self.defs_state, default_key=f"MongoCdcComponent[{name}]")

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        # relative paths are relative to the defs.yaml, also for the discovery that runs before building
        object.__setattr__(self, "_base_dir", context.path)
        return super().build_defs(context)

    def get_asset_spec(self, props: MongoCdcAssetProps) -> AssetSpec:
        """The one override point: the default translator's spec with ``translation`` applied."""
        base = MongoCdcTranslator.get_asset_spec(_ComponentTranslator(self), props)
        return self.translation(base, props) if self.translation is not None else base

    def write_state_to_path(self, state_path: Path) -> None:
        state_path.write_text(discover(self.settings().load_config()).to_json())

    def build_defs_from_state(self, context: ComponentLoadContext, state_path: Path | None) -> Definitions:
        settings = self.settings(context.path)
        state = DiscoveryState.from_json(state_path.read_text()) if state_path is not None else discover(
            settings.load_config())
        return build_definitions(settings, state, _ComponentTranslator(self))
