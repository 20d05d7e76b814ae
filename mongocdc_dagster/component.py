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

Collections are discovered from MongoDB each time the code location loads and kept as Dagster defs state
(``VERSIONED_STATE_STORAGE`` by default: on the Dagster instance, ``$DAGSTER_HOME/defs_state`` or
the ``base_path`` its ``defs_state_storage`` names; ``LOCAL_FILESYSTEM``: the project's
``.local_defs_state``). Run workers build from the stored version their code location loaded (the latest,
with a warning, if old versions were pruned since); a load
(code server, ``dg``, ``dagster asset materialize``) while MongoDB cannot be reached builds the last
stored collections and warns. Attributes left out fall back to ``MONGOCDC_*`` environment variables, then to the local stack
of ``make dev``. Several connectors in one project each need a ``name`` (see ``naming.py``). ``dg
scaffold defs mongocdc_dagster.MongoCdcComponent <path>`` writes a defs.yaml to start from.

No ``from __future__ import annotations``: the component's attributes are resolved from its annotations.
"""

import asyncio
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Self

from dagster import (
    AssetSpec,
    ComponentLoadContext,
    DagsterInstance,
    Definitions,
    Resolvable,
    StateBackedComponent,
)
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
from dagster._core.storage.defs_state.base import DefsStateStorage, set_defs_state_storage
from dagster._core.storage.defs_state.blob_storage_state_storage import UPathDefsStateStorage
from dagster.components import DefsStateConfig, DefsStateConfigArgs, ResolvedDefsStateConfig
from dagster.components.scaffold.scaffold import Scaffolder, ScaffoldRequest, scaffold_with
from dagster.components.utils.project_paths import get_local_state_path
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from dagster_shared.serdes.objects.models.defs_state_info import DefsStateManagementType
from pydantic import BaseModel

from mongocdc_dagster.build import build_definitions
from mongocdc_dagster.discovery import DiscoveryError, DiscoveryState, discover, discover_or_raise
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.settings import CdcSettings, SettingsError
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


#: Stored versions of a component's defs state kept: the newest few, and every one younger than a day (a
#: code location loaded before and not reloaded since builds its runs from the version it pinned then; an older
#: pinned version pruned meanwhile is replaced by the latest, see :func:`repin_pruned_version`).
KEPT_STATE_VERSIONS = 10
KEPT_STATE_AGE = timedelta(days=1)


def prune_stored_versions(storage: DefsStateStorage | None, key: str) -> list[str]:
    """Delete the stored versions of ``key`` beyond the newest :data:`KEPT_STATE_VERSIONS` and older than
    :data:`KEPT_STATE_AGE`; returns them. Every load of a code location (a code server, ``dg``, a command-line
    launch) and every change the discovery sensor stores writes a version, and Dagster deletes none. Only a
    storage whose versions can be listed (the instance's files, or a blob store's ``base_path``) is pruned;
    the latest version is always kept."""
    if not isinstance(storage, UPathDefsStateStorage):
        return []
    folder = storage.base_path / storage._sanitize_key(key)  # the storage's own layout: <base>/<key>/<version>
    if not folder.exists():
        return []
    latest = storage.get_latest_version(key)
    by_age = sorted(((entry.stat().st_mtime, entry) for entry in folder.iterdir() if entry.is_file()),
                    key=lambda item: item[0], reverse=True)
    cutoff = (datetime.now(UTC) - KEPT_STATE_AGE).timestamp()
    pruned = [entry for mtime, entry in by_age[KEPT_STATE_VERSIONS:] if mtime < cutoff and entry.name != latest]
    for entry in pruned:
        entry.unlink()
    return [entry.name for entry in pruned]


def repin_pruned_version(load_context: DefinitionsLoadContext, storage: DefsStateStorage | None, key: str) -> None:
    """A reconstruction (a run worker) whose pinned version of ``key`` was pruned builds from the latest stored
    version instead, and warns naming both. A code server up longer than :data:`KEPT_STATE_AGE` still launches
    runs at the version it pinned at load, and :func:`prune_stored_versions` may have deleted it since: with this
    fallback a run never fails for it (the collections are the same or, discovered later, a superset). Simpler
    than keeping every pinned version alive, which a code server whose discovery sensor is off could not do."""
    pinned = load_context.get_defs_key_state_info(key)
    if pinned is None or not isinstance(storage, UPathDefsStateStorage):
        return  # only a storage prune_stored_versions prunes can have lost the pinned version
    if pinned.management_type != DefsStateManagementType.VERSIONED_STATE_STORAGE:
        return
    if storage._get_state_path(key, pinned.version).exists():  # the storage's own layout: <base>/<key>/<version>
        return
    latest = storage.get_latest_version(key)
    if latest is None:
        return  # nothing stored at all: the storage's own error says so
    warnings.warn(
        f"defs state {key!r}: version {pinned.version} (pinned when the code location loaded) is no longer stored "
        f"(pruned); the definitions are built from the latest stored version, {latest}", PrunedDefsStateWarning,
        stacklevel=2)
    load_context.add_defs_state_info(key, latest)


class PrunedDefsStateWarning(UserWarning):
    """A run worker's pinned defs state version was pruned: the latest stored version stood in for it."""


class StoredDefsStateWarning(UserWarning):
    """MongoDB could not be listed at load: the definitions were built from the stored defs state (or, with
    none stored yet, have no collections)."""


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
    name: str | None = None
    """Names this connector's resources, sensors, schedules, jobs and pools (mongocdc_<name>_...) and its defs
    state; needed when a project has several connectors. Unset: the names mongocdc has always used."""
    translation: Annotated[
        TranslationFn[MongoCdcAssetProps],
        TranslationFnResolver[MongoCdcAssetProps](template_vars_for_translation_fn=_translation_scope),
    ] | None = None
    """Asset attributes per output, templated with props, kind, namespace, database, collection."""
    defs_state: ResolvedDefsStateConfig = field(default_factory=DefsStateConfigArgs.versioned_state_storage)

    @classmethod
    def load(cls, attributes: BaseModel | None, context: ComponentLoadContext) -> Self:
        component = super().load(attributes, context)
        # relative paths are relative to the defs.yaml, also for `dg utils refresh-defs-state`, which
        # refreshes the state of loaded components without building their definitions
        object.__setattr__(component, "_base_dir", context.path)
        object.__setattr__(component, "_project_root", context.project_root)
        return component

    def settings(self, base_dir: Path | None = None) -> CdcSettings:
        return CdcSettings.resolve(
            connector_config=self.connector_config, connector_properties=self.connector_properties, home=self.home,
            slice_granularity=self.slice_granularity, slice_start=self.slice_start,
            sensor_interval_seconds=self.sensor_interval_seconds, kafka_bootstrap=self.kafka_bootstrap,
            tables=self.tables, spark_master=self.spark_master, ranged_snapshots=self.ranged_snapshots,
            name=self.name, base_dir=base_dir or getattr(self, "_base_dir", None),
        )

    @property
    def defs_state_config(self) -> DefsStateConfig:
        # the same key in every process, whatever the working directory: the connector's name
        return DefsStateConfig.from_args(self.defs_state, default_key=f"MongoCdcComponent[{self.name or 'mongocdc'}]")

    def get_asset_spec(self, props: MongoCdcAssetProps) -> AssetSpec:
        """The one override point: the default translator's spec with ``translation`` applied."""
        base = MongoCdcTranslator.get_asset_spec(_ComponentTranslator(self), props)
        return self.translation(base, props) if self.translation is not None else base

    async def refresh_state(self, project_root: Path) -> str:
        """Dagster's refresh, reading the stored state first: the collections gone since stay in it as dropped."""
        object.__setattr__(self, "_previous_state", self.stored_state(project_root))
        return await super().refresh_state(project_root)

    def stored_state(self, project_root: Path) -> DiscoveryState | None:
        """The latest stored discovery state (None: nothing stored, or not readable as one)."""
        config = self.defs_state_config
        storage = DefsStateStorage.get()
        with tempfile.TemporaryDirectory() as temp_dir:
            if config.management_type == DefsStateManagementType.LOCAL_FILESYSTEM:
                path = get_local_state_path(config.key, project_root)
            else:
                version = None if storage is None else storage.get_latest_version(config.key)
                if storage is None or version is None:
                    return None
                path = Path(temp_dir) / "state"
                storage.download_state_to_path(config.key, version, path)
            try:
                return DiscoveryState.from_json(path.read_text())
            except (OSError, ValueError):
                return None

    def write_state_to_path(self, state_path: Path) -> None:
        state = discover_or_raise(MongoCdcResource.for_load(self.settings()))
        state_path.write_text(state.keeping_dropped(getattr(self, "_previous_state", None)).to_json())

    def build_defs(self, context: ComponentLoadContext) -> Definitions:
        """Discovers and stores the collections when the code location initialises (falling back to the last
        stored ones when MongoDB cannot be listed); a reconstruction (run worker) builds from the version the
        code location pinned, or the latest if that one was pruned since. Replaces the base class's flow, which
        drops the last good state on an outage."""
        names = [c.name for c in context.component_tree.get_all_components(of_type=MongoCdcComponent)]
        if names.count(self.name) > 1:
            raise SettingsError(
                f"{names.count(self.name)} MongoCdcComponents are " + (f"named {self.name!r}" if self.name else "unnamed")
                + ": give each connector of the project its own `name` (it names the connector's resources, sensors, "
                "schedules, jobs, pools and defs state)")
        config = self.defs_state_config
        if config.management_type == DefsStateManagementType.LEGACY_CODE_SERVER_SNAPSHOTS:
            raise SettingsError(
                "defs_state: LEGACY_CODE_SERVER_SNAPSHOTS keeps the collections only in the code server's memory, so "
                "command-line launches cannot rebuild them and an outage at load loses them; use "
                "VERSIONED_STATE_STORAGE (the default) or LOCAL_FILESYSTEM")
        settings = self.settings(context.path)
        storage = DefsStateStorage.get()
        load_context = DefinitionsLoadContext.get()
        error: str | None = None
        if load_context.load_type == DefinitionsLoadType.INITIALIZATION:
            if storage is None and config.management_type == DefsStateManagementType.VERSIONED_STATE_STORAGE:
                # no instance to store on (a bare load_from_defs_folder): what MongoDB says now, kept in memory
                return build_definitions(settings, discover(MongoCdcResource.for_load(settings)), _ComponentTranslator(self))
            try:
                version = asyncio.run(self.refresh_state(context.project_root))
                load_context.add_defs_state_info(config.key, version)
            except DiscoveryError as exc:
                error = str(exc)
            else:
                prune_stored_versions(storage, config.key)
        elif config.management_type == DefsStateManagementType.VERSIONED_STATE_STORAGE:
            repin_pruned_version(load_context, storage, config.key)
        with load_context.state_path(config, storage, context.project_root) as state_path:
            return self.build_defs_from_state(context, state_path, error)

    def build_defs_from_state(self, context: ComponentLoadContext, state_path: Path | None,
                              error: str | None = None) -> Definitions:
        """The definitions of the stored collections; ``error``: MongoDB could not be listed at this load, so the
        stored state stands in for it (and a warning says so). Nothing stored: discover now, or no collections."""
        settings = self.settings(context.path)
        if state_path is not None:
            state = DiscoveryState.from_json(state_path.read_text())
            if error is not None:
                state = replace(state, error=error, from_store=True)
        elif error is not None:
            state = DiscoveryState((), datetime.now(UTC), None, error)
        else:
            state = discover(MongoCdcResource.for_load(settings))
        if state.error is not None:
            warnings.warn(state.stored_note, StoredDefsStateWarning, stacklevel=2)
        return build_definitions(settings, state, _ComponentTranslator(self), self.store_state)

    def store_state(self, instance: DagsterInstance) -> None:
        """Discover now and store it as this component's defs state (the discovery sensor, when the captured
        collections changed); raises :class:`DiscoveryError` when MongoDB cannot be listed."""
        with set_defs_state_storage(instance.defs_state_storage):
            asyncio.run(self.refresh_state(getattr(self, "_project_root", Path.cwd())))
        prune_stored_versions(instance.defs_state_storage, self.defs_state_config.key)
