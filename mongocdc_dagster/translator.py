"""Maps each captured collection's CDC outputs to Dagster asset specs; subclass it to rename, regroup or retag.

Modelled on ``DagsterSlingTranslator``: :meth:`MongoCdcTranslator.get_asset_spec` is the one override
point, and the default implementation assembles it from small methods (key, group, tags, kinds,
description, metadata, dependencies, freshness, automation). Every collection gets one asset per kind:

=====================  =======================================================  ===================
kind                   what it is                                               default key
=====================  =======================================================  ===================
snapshot               blocking snapshot (one file, or one file per _id range)  ``<db>/<coll>/snapshot``
incremental_snapshot   chunked, watermarked snapshot                            ``…/incremental_snapshot``
slices                 change events per clusterTime window (partitioned)       ``…/slices``
changelog              Delta table of every event (reads the three above)       ``…/changelog``
current_state          Delta table, one row per document (reads changelog)      ``…/current_state``
=====================  =======================================================  ===================

Dependencies are built from the keys this same translator gives the upstream kinds, so renaming a
key renames the edges too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal
from weakref import WeakKeyDictionary

from dagster import (
    AssetDep,
    AssetKey,
    AssetSpec,
    AutomationCondition,
    AutomationContext,
    AutomationResult,
    FreshnessPolicy,
    MetadataValue,
    TableColumn,
    TableSchema,
)

from mongocdc_core.sinks.parquet import LANDING_SCHEMA

if TYPE_CHECKING:  # private Dagster modules, named in annotations only (not evaluated at run time)
    from dagster._core.asset_graph_view.asset_graph_view import AssetGraphView
    from dagster._core.definitions.assets.graph.base_asset_graph import BaseAssetGraph
    from dagster._core.definitions.events import AssetKeyPartitionKey

CdcKind = Literal["snapshot", "incremental_snapshot", "slices", "changelog", "current_state"]
CDC_KINDS: tuple[CdcKind, ...] = ("snapshot", "incremental_snapshot", "slices")
TABLE_KINDS: tuple[CdcKind, ...] = ("changelog", "current_state")
_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_]")

_DESCRIPTIONS: dict[CdcKind, str] = {
    "snapshot": (
        "Blocking snapshot of `{ns}`: every document as a Debezium read (`op: r`) record, all carrying the "
        "cluster position taken before the copy started."
    ),
    "incremental_snapshot": "Incremental (chunked, watermarked) snapshot of `{ns}`, readable while streaming continues.",
    "slices": (
        "Change events of `{ns}` in half-open clusterTime windows [start, end) as Debezium change event records; "
        "re-materialising a window yields the same events while the oplog holds them."
    ),
    "changelog": "Every change event of `{ns}` as a Delta table (one row per event, with its position).",
    "current_state": "The latest version of every document of `{ns}` as a Delta table (highest position wins).",
}


def tag_value(text: str) -> str:
    """Dagster tag values allow letters, digits, `_.-` and at most 63 characters."""
    return _TAG_UNSAFE.sub("_", text)[:63]


def name_part(text: str) -> str:
    """A piece of a Dagster name (group, op, job): letters, digits and underscores."""
    return _NAME_UNSAFE.sub("_", text)


@dataclass(frozen=True)
class MongoCdcAssetProps:
    """What the translator knows about one output of one collection.

    ``landing_dir`` is the landing zone folder of the kind (CDC kinds) and ``table_root`` where the
    Delta tables live (table kinds); ``slice_seconds`` is the window length of the slices.
    """

    kind: CdcKind
    namespace: str
    connector_name: str
    topic: str
    landing_dir: str
    table_root: str
    slice_seconds: int
    estimated_documents: int | None = None

    @property
    def database(self) -> str:
        return self.namespace.partition(".")[0]

    @property
    def collection(self) -> str:
        return self.namespace.partition(".")[2]

    def of_kind(self, kind: CdcKind) -> MongoCdcAssetProps:
        """The same collection's props for another kind (to name a dependency)."""
        return replace(self, kind=kind)


class PoolInProgress(AutomationCondition[AssetKey]):
    """True while a run is queued or running that is to materialise an asset of this asset's pool (any asset of
    it, not only this one), until that run has materialised it (Dagster's ``in_progress`` of each asset).

    Dagster groups what one automation tick requests into one run, but ``~in_progress()`` excludes only
    the assets of the run in progress: a collection that landed while another's refresh ran was requested
    alone, to queue behind it for the pool, and each such run kept its own collections apart from then on
    (the soak's table refreshes ended up in runs of one collection each, each starting a Spark session). Waiting
    while the pool is busy lets the next tick take every collection that landed meanwhile in one run.
    Evaluated in the code location (a condition of our own: the automation sensor sets
    ``use_user_code_server``)."""

    @property
    def name(self) -> str:
        return "pool_in_progress"

    @property
    def description(self) -> str:
        return "a run of an asset of this asset's pool is queued or running"

    @property
    def requires_cursor(self) -> bool:
        return False

    # Dagster awaits an evaluate that is a coroutine function (its in-progress look-ups are coroutines)
    async def evaluate(self, context: AutomationContext[AssetKey]) -> AutomationResult[AssetKey]:  # type: ignore[override]
        graph, view = context.asset_graph, context.asset_graph_view
        pools = frozenset(graph.get(context.key).pools or ())
        if context.candidate_subset.is_empty or not pools:
            return AutomationResult(context, context.get_empty_subset())
        # the same for every asset of the pool in one tick (one view each; runs are launched after it): looked up
        # once, not once per candidate (a tick where hundreds of collections landed looked them all up for each)
        busy = _POOLS_BUSY.setdefault(view, {})
        if pools not in busy:  # (set once looked up: an evaluation awaiting meanwhile looks up too)
            busy[pools] = await _pool_in_progress(graph, view, pools)
        return AutomationResult(context, context.candidate_subset if busy[pools] else context.get_empty_subset())


#: Per automation tick (its asset graph view), pools -> whether a run of an asset of them is queued or running.
_POOLS_BUSY: WeakKeyDictionary[AssetGraphView, dict[frozenset[str], bool]] = WeakKeyDictionary()


async def _pool_in_progress(graph: BaseAssetGraph, view: AssetGraphView, pools: frozenset[str]) -> bool:
    """Whether a run that is to materialise an asset of ``pools`` is queued or running."""
    for key in sorted(graph.materializable_asset_keys, key=lambda k: k.to_user_string()):
        if not pools & (graph.get(key).pools or set()):
            continue
        running = await view.compute_run_in_progress_subset(key=key, from_subset=view.get_full_subset(key=key))
        if not running.is_empty:
            return True
    return False


#: Materialisation metadata: whether it brought data its downstream tables have not seen (False: a slice window
#: that held no event, a changelog refresh that found nothing new). Absent means it may have.
NEW_DATA = "new_data"


class BroughtData(AutomationCondition[AssetKey]):
    """True for the asset partitions whose latest materialisation brought data (``new_data`` not False).

    Evaluated on a table's dependencies after ``newly_updated``: a window that landed empty, the usual one of a
    quiet collection, requests no refresh of its tables (hundreds of quiet collections each asked for one
    every window). A snapshot always counts: even an empty one removes the rows its collection no longer has.
    One event-log read per partition updated since the last tick."""

    @property
    def name(self) -> str:
        return "brought_data"

    @property
    def description(self) -> str:
        return "its latest materialisation brought new data"

    @property
    def requires_cursor(self) -> bool:
        return False

    def evaluate(self, context: AutomationContext[AssetKey]) -> AutomationResult[AssetKey]:  # type: ignore[override]
        view = context.asset_graph_view
        queryer = view.get_inner_queryer_for_back_compat()
        brought: set[AssetKeyPartitionKey] = set()
        for partition in context.candidate_subset.expensively_compute_asset_partitions():
            record = queryer.get_latest_materialization_or_observation_record(partition)
            said = record.asset_materialization.metadata.get(NEW_DATA) if record and record.asset_materialization else None
            if said is None or said.value is not False:
                brought.add(partition)
        return AutomationResult(context, view.get_asset_subset_from_asset_partitions(context.key, brought))


class MongoCdcTranslator:
    """Default naming: keys ``<db>/<coll>/<kind>``, group ``<db>``, kinds mongodb+parquet or spark+delta.

    ``failed_refresh_retry_cron`` is the back-off of a failed table refresh: the automation requests it
    again at the first tick of this schedule after its last request, so at most once per period (every
    five minutes by default) while it keeps failing, and no longer once it succeeds.

    ``table_run_max_runtime_seconds`` bounds the automation's refresh runs (Dagster's ``dagster/max_runtime``):
    a run whose worker died with the code server that launched it would otherwise stay STARTED for ever and,
    holding the tables' pool, stop every collection's refresh. Past it, run monitoring fails the run and Dagster's
    run retries start it again. Six hours by default: far above a first build of a large collection; raise
    it in a subclass for tables whose first build takes longer.
    """

    key_prefix: Sequence[str] = ()
    failed_refresh_retry_cron: str = "*/5 * * * *"
    table_run_max_runtime_seconds: int = 6 * 3600

    def get_asset_key(self, props: MongoCdcAssetProps) -> AssetKey:
        return AssetKey([*self.key_prefix, props.database, props.collection, props.kind])

    def get_group_name(self, props: MongoCdcAssetProps) -> str:
        return name_part(props.database)

    def get_tags(self, props: MongoCdcAssetProps) -> Mapping[str, str]:
        return {
            "mongocdc/kind": props.kind,
            "mongocdc/collection": tag_value(props.namespace),
            "mongocdc/connector": tag_value(props.connector_name),
        }

    def get_kinds(self, props: MongoCdcAssetProps) -> set[str]:
        return {"spark", "delta"} if props.kind in TABLE_KINDS else {"mongodb", "parquet"}

    def get_owners(self, props: MongoCdcAssetProps) -> Sequence[str]:
        return []

    def get_description(self, props: MongoCdcAssetProps) -> str:
        return _DESCRIPTIONS[props.kind].format(ns=props.namespace)

    def get_table_name(self, props: MongoCdcAssetProps) -> str | None:
        """The Delta table's name (table kinds): ``<db>__<coll>__changelog`` / ``__current``."""
        if props.kind == "changelog":
            return f"{props.database}__{props.collection}__changelog"
        if props.kind == "current_state":
            return f"{props.database}__{props.collection}__current"
        return None

    def get_metadata(self, props: MongoCdcAssetProps) -> Mapping[str, Any]:
        meta: dict[str, Any] = {
            "mongocdc/collection": props.namespace,
            "mongocdc/connector": props.connector_name,
            "mongocdc/topic": props.topic,
        }
        if props.kind in TABLE_KINDS:
            name = self.get_table_name(props)
            if name is not None:
                meta["dagster/table_name"] = name
                meta["dagster/uri"] = MetadataValue.path(f"{props.table_root.rstrip('/')}/{name}")
        else:
            meta["dagster/uri"] = MetadataValue.path(f"{props.landing_dir}/{props.namespace}")
            # every landing file of every CDC kind has the same columns (the engine's Parquet sink)
            meta["dagster/column_schema"] = TableSchema(
                columns=[TableColumn(f.name, str(f.type)) for f in LANDING_SCHEMA]
            )
        if props.estimated_documents is not None:
            meta["mongocdc/estimated_documents"] = props.estimated_documents
        return meta

    def get_deps(self, props: MongoCdcAssetProps) -> Sequence[AssetDep]:
        """changelog reads the three landing kinds; current_state reads changelog."""
        upstream: tuple[CdcKind, ...] = ()
        if props.kind == "changelog":
            upstream = CDC_KINDS
        elif props.kind == "current_state":
            upstream = ("changelog",)
        return [AssetDep(self.get_asset_spec(props.of_kind(kind)).key) for kind in upstream]

    def get_freshness_policy(self, props: MongoCdcAssetProps) -> FreshnessPolicy | None:
        """Slices and tables should be no older than two windows (warn after one and a half)."""
        if props.kind in ("slices", "changelog", "current_state"):
            window = timedelta(seconds=props.slice_seconds)
            return FreshnessPolicy.time_window(fail_window=window * 2, warn_window=window * 3 / 2)
        return None

    def get_automation_condition(self, props: MongoCdcAssetProps) -> AutomationCondition | None:
        """Tables refresh when what they read was updated with data (a slice that held an event landed, a
        snapshot finished), and again after a failed refresh (``failed_refresh_retry_cron``)."""
        if props.kind in TABLE_KINDS:
            # One run for every collection with something new: none is requested while a refresh of any
            # collection is queued or running (the tables' pool, one run at a time), so the next tick takes
            # all that landed meanwhile together (PoolInProgress), where each requested alone queued apart.
            # eager() without "no dependency missing": a table depends on every window of the slices,
            # and old windows are never all materialised; nor "no dependency in progress": the next
            # window's slice run is nearly always queued or running on a busy deployment, so a refresh
            # reads what has landed and the next landing asks for the next (one at a time: not in progress).
            # Handled by a request, not by the table's update (since_last_handled): a refresh that ends
            # materialised what had landed when it started, so what landed while it ran is refreshed after
            # it (its materialisations of the tables it selected are no dependency update, Dagster's rule).
            # A landing seen on the tick after the request (its run under way) is not handled by it either.
            # A refresh that failed is retried without waiting for the next landing (on a quiet collection
            # that may never come): its latest execution failed and a tick of the back-off schedule passed
            # since it was last requested or seen failing (a failed launch by hand waits too), so a refresh
            # that always fails is requested once per period.
            # A dependency's update counts when it brought data (BroughtData): Dagster's any_deps_updated, but a
            # window that landed empty asks for nothing.
            updated = AutomationCondition.any_deps_match(
                (AutomationCondition.newly_updated() & ~AutomationCondition.executed_with_root_target()
                 & BroughtData()).with_label("newly_updated_with_data_without_root")
                | AutomationCondition.will_be_requested()
            ).with_label("any_deps_updated_with_data")
            landed = AutomationCondition.newly_missing() | updated
            handled = (AutomationCondition.newly_requested() & ~landed) | AutomationCondition.initial_evaluation()
            failed = AutomationCondition.execution_failed()
            backed_off = AutomationCondition.cron_tick_passed(self.failed_refresh_retry_cron).since(
                AutomationCondition.newly_requested() | failed.newly_true())
            retry = (failed & backed_off).with_label("retry a failed refresh")
            return ((landed.since(handled) | retry) & ~AutomationCondition.in_progress()
                    & ~PoolInProgress()).with_label("refresh when upstream lands")
        return None

    def get_asset_spec(self, props: MongoCdcAssetProps) -> AssetSpec:
        """The one override point: everything Dagster shows about this output."""
        return AssetSpec(
            key=self.get_asset_key(props),
            group_name=self.get_group_name(props),
            tags=self.get_tags(props),
            kinds=self.get_kinds(props),
            owners=self.get_owners(props),
            description=self.get_description(props),
            metadata=self.get_metadata(props),
            deps=self.get_deps(props),
            freshness_policy=self.get_freshness_policy(props),
            automation_condition=self.get_automation_condition(props),
        )
