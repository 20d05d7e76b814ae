"""Sensors: collection discovery, the signaling collection, and the oplog window.

Each is built by a factory from the CDC assets and partitions it serves, like the sensors
dagster integration libraries ship, so a second connector gets its own set with its own keys.
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from bson import json_util
from dagster import (
    AddDynamicPartitionsRequest,
    AssetObservation,
    AssetSelection,
    DagsterRunStatus,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    MetadataValue,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from mongocdc_core.source.signals import WATERMARK_CLOSE, WATERMARK_OPEN
from mongocdc_dagster.assets.cdc import CdcAssets
from mongocdc_dagster.history import collection_histories, known_collections, needed_window_start
from mongocdc_dagster.partitions import COLLECTIONS_PARTITIONS_NAME, CdcPartitions
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.signals import EXECUTE, SignalError, SnapshotSignal, parse_signal, signal_id_of

SIGNAL_BATCH = 100
# Incremental snapshots write their chunk watermarks (string _ids) into the same collection; they are
# not requests, and skipping them keeps the _id cursor on the signals' own _id type.
_NOT_WATERMARK = {"type": {"$nin": [WATERMARK_OPEN, WATERMARK_CLOSE]}}
WARN_FRACTION = 0.25  # warn when the next needed window is in the oldest quarter of the oplog
_ACTIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]

TAG_KIND = "mongocdc/kind"
TAG_COLLECTION = "mongocdc/collection"
TAG_SIGNAL = "mongocdc/signal_id"
TAG_SNAPSHOT_TYPE = "mongocdc/snapshot_type"


def build_discovery_sensor(interval_s: int) -> SensorDefinition:
    """Keeps the dynamic `collections` partitions equal to the captured collections."""

    @sensor(name="mongocdc_collection_discovery", minimum_interval_seconds=interval_s,
            default_status=DefaultSensorStatus.RUNNING,
            description="Adds and removes `collections` partitions from the connector's include/exclude filters.")
    def discovery(context: SensorEvaluationContext, mongocdc: MongoCdcResource) -> SensorResult | SkipReason:
        wanted = set(mongocdc.captured_collections())
        existing = set(context.instance.get_dynamic_partitions(COLLECTIONS_PARTITIONS_NAME))
        added, removed = sorted(wanted - existing), sorted(existing - wanted)
        if not added and not removed:
            return SkipReason(f"{len(existing)} captured collections, unchanged")
        requests: list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest] = []
        if added:
            context.log.info(f"new captured collections: {', '.join(added)}")
            requests.append(AddDynamicPartitionsRequest(COLLECTIONS_PARTITIONS_NAME, added))
        if removed:
            context.log.info(f"collections no longer captured: {', '.join(removed)}")
            requests.append(DeleteDynamicPartitionsRequest(COLLECTIONS_PARTITIONS_NAME, removed))
        return SensorResult(dynamic_partitions_requests=requests)

    return discovery


def _cursor(last_id: Any) -> str:
    return json_util.dumps({"last_id": last_id})


def _run_snapshot_type(run_tags: dict[str, str], asset_selection: Any, assets: CdcAssets) -> str | None:
    if TAG_SNAPSHOT_TYPE in run_tags:
        return run_tags[TAG_SNAPSHOT_TYPE]
    if asset_selection and assets.snapshot_key in asset_selection:
        return "blocking"
    if asset_selection and assets.incremental_snapshot_key in asset_selection:
        return "incremental"
    return None


def _stop_runs(context: SensorEvaluationContext, signal: SnapshotSignal, assets: CdcAssets) -> list[str]:
    """Cancel in-flight snapshot runs of the signal's type whose collection the signal matches."""
    stopped: list[str] = []
    for run in context.instance.get_runs(filters=RunsFilter(statuses=_ACTIVE)):
        kind = _run_snapshot_type(dict(run.tags), run.asset_selection, assets)
        if kind is None or (signal.snapshot_type is not None and kind != signal.snapshot_type):
            continue
        namespace = run.tags.get(TAG_COLLECTION) or run.tags.get("dagster/partition")
        if namespace is None or not signal.matches(namespace):
            continue
        context.instance.run_coordinator.cancel_run(run.run_id)
        stopped.append(run.run_id)
    return stopped


def build_signal_sensor(interval_s: int, assets: CdcAssets) -> SensorDefinition:
    """Turns execute-snapshot / stop-snapshot signals into runs / cancellations, one run per signal and collection.

    The first tick only records the newest existing `_id`; later ticks read at most SIGNAL_BATCH newer
    signals in `_id` order and the cursor holds the `_id` of the last one handled. Run keys
    `<signal _id>:<collection>` make a signal launch at most once even if the cursor is rewound. Signals
    are expected to share one `_id` type (ObjectId when the inserts omit it).
    """
    @sensor(name="mongocdc_signals", minimum_interval_seconds=interval_s,
            default_status=DefaultSensorStatus.RUNNING, target=AssetSelection.assets(*assets.snapshot_keys),
            description="Reads Debezium snapshot signals from signal.data.collection.")
    def signals(context: SensorEvaluationContext, mongocdc: MongoCdcResource) -> SensorResult | SkipReason:
        cfg = mongocdc.load_config()
        if not cfg.signal_data_collection:
            return SkipReason("signal.data.collection is not set in the connector config")
        if "source" not in cfg.signal_enabled_channels:
            return SkipReason(f"the source signal channel is not enabled ({', '.join(cfg.signal_enabled_channels)})")
        db, _, coll = cfg.signal_data_collection.partition(".")
        client = mongocdc.client()
        try:
            signals_coll = client[db][coll]
            if not context.cursor:
                # Like Debezium's source channel, only signals sent after the sensor started count: a new or
                # reset sensor must not replay the collection's history.
                newest = signals_coll.find_one(_NOT_WATERMARK, {"_id": 1}, sort=[("_id", -1)])
                last = None if newest is None else newest["_id"]
                return SensorResult(skip_reason=f"started; signals up to _id {last!r} predate the sensor",
                                    cursor=_cursor(last))
            last_id = json_util.loads(context.cursor)["last_id"]
            query = dict(_NOT_WATERMARK) if last_id is None else {**_NOT_WATERMARK, "_id": {"$gt": last_id}}
            docs = list(signals_coll.find(query).sort("_id", 1).limit(SIGNAL_BATCH))
        finally:
            client.close()
        if not docs:
            return SkipReason("no new signals")
        collections = known_collections(context.instance)
        captured: list[str] | None = None
        run_requests: list[RunRequest] = []
        new_partitions: set[str] = set()
        notes: list[str] = []
        for doc in docs:
            try:
                signal = parse_signal(doc)
            except SignalError as exc:
                context.log.warning(f"malformed signal skipped: {exc}")
                notes.append(f"malformed: {exc}")
                continue
            if signal is None:
                notes.append(f"signal {signal_id_of(doc)} of type {doc.get('type')!r} is not for Dagster")
                continue
            if signal.action != EXECUTE:
                stopped = _stop_runs(context, signal, assets)
                context.log.info(f"stop-snapshot {signal.signal_id}: cancelled {len(stopped)} run(s) {stopped}")
                notes.append(f"stop-snapshot {signal.signal_id} cancelled {len(stopped)} run(s)")
                continue
            if captured is None:
                captured = mongocdc.captured_collections(cfg)
            matched = signal.matching(captured)
            if not matched:
                notes.append(f"signal {signal.signal_id} matches no captured collection")
                continue
            key = assets.incremental_snapshot_key if signal.snapshot_type == "incremental" else assets.snapshot_key
            for namespace in matched:
                if namespace not in collections:
                    new_partitions.add(namespace)
                filter_text = signal.condition_for(namespace)
                run_requests.append(RunRequest(
                    run_key=f"{signal.signal_id}:{namespace}",
                    partition_key=namespace,
                    asset_selection=[key],
                    run_config={"ops": {"_".join(key.path): {"config": {
                        "filter": filter_text, "signal_id": signal.signal_id}}}},
                    tags={TAG_KIND: key.path[-1], TAG_COLLECTION: namespace, TAG_SIGNAL: signal.signal_id,
                          TAG_SNAPSHOT_TYPE: signal.snapshot_type or "incremental"},
                ))
            context.log.info(f"execute-snapshot {signal.signal_id}: {signal.snapshot_type} snapshot of {matched}")
        cursor = _cursor(docs[-1]["_id"])
        partition_requests = (
            [AddDynamicPartitionsRequest(COLLECTIONS_PARTITIONS_NAME, sorted(new_partitions))] if new_partitions else []
        )
        if run_requests:
            return SensorResult(run_requests=run_requests, cursor=cursor, dynamic_partitions_requests=partition_requests)
        return SensorResult(skip_reason="; ".join(notes) or "no snapshot requests", cursor=cursor,
                            dynamic_partitions_requests=partition_requests)

    return signals


def build_oplog_window_sensor(interval_s: int, assets: CdcAssets, partitions: CdcPartitions) -> SensorDefinition:
    """Observes the oplog window and each collection's lag; re-snapshots collections whose history was lost.

    A collection's next slice must start where its landed history ends (see `needed_window_start`). When
    that point is in the oldest WARN_FRACTION of the oplog it warns; once it has left the oplog the
    missing changes can only be recovered by a new snapshot, so it requests one for just those collections.
    """

    @sensor(name="mongocdc_oplog_window", minimum_interval_seconds=interval_s,
            default_status=DefaultSensorStatus.RUNNING, target=AssetSelection.assets(assets.snapshot_key),
            description="Oplog window size, growth and per-collection lag; re-snapshots after history loss.")
    def oplog_window(context: SensorEvaluationContext, mongocdc: MongoCdcResource) -> SensorResult:
        window = mongocdc.oplog_window()
        now = datetime.now(UTC)
        first = datetime.fromtimestamp(window.first.time, UTC)
        last = datetime.fromtimestamp(window.last.time, UTC)
        previous = orjson.loads(context.cursor) if context.cursor else None
        growth: float | None = None
        if previous is not None and now.timestamp() > previous["at"]:
            growth = (window.size_bytes - previous["size"]) / ((now.timestamp() - previous["at"]) / 3600)
        metadata: dict[str, Any] = {
            "oplog_window_hours": round(window.hours, 4),
            "oplog_first": MetadataValue.timestamp(first),
            "oplog_last": MetadataValue.timestamp(last),
            "oplog_size_bytes": window.size_bytes,
            "oplog_max_bytes": window.max_bytes,
            "oplog_growth_bytes_per_hour": None if growth is None else round(growth, 1),
        }
        margin = timedelta(seconds=max(partitions.seconds, (last - first).total_seconds() * WARN_FRACTION))
        lost: list[str] = []
        at_risk: list[str] = []
        run_requests: list[RunRequest] = []
        histories = collection_histories(context.instance, partitions, assets.snapshot_keys, assets.stream_slice_key)
        for namespace, history in histories.items():
            if history.window_keys:
                end = partitions.window(history.window_keys[-1]).end
                metadata[f"lag_s/{namespace}"] = round((now - end).total_seconds(), 1)
            needed = needed_window_start(history, partitions)
            if needed is None:
                continue
            if needed < first:
                lost.append(namespace)
                run_requests.append(RunRequest(
                    run_key=f"resnapshot:{namespace}:{int(needed.timestamp())}",
                    partition_key=namespace, asset_selection=[assets.snapshot_key],
                    tags={TAG_KIND: "snapshot", TAG_COLLECTION: namespace, "mongocdc/reason": "history_lost"},
                ))
            elif needed - first < margin:
                at_risk.append(namespace)
        for namespace in at_risk:
            context.log.warning(
                f"{namespace}: the next unmaterialised window starts close to the oplog start ({first.isoformat()}); "
                "materialise its stream slices soon or its history will be lost"
            )
        for namespace in lost:
            context.log.error(f"{namespace}: unmaterialised history has left the oplog; requesting a new snapshot")
        metadata["collections_at_risk"] = ", ".join(at_risk) or "none"
        metadata["collections_history_lost"] = ", ".join(lost) or "none"
        cursor = orjson.dumps({"at": now.timestamp(), "size": window.size_bytes}).decode()
        observation = AssetObservation(asset_key=assets.stream_slice_key, metadata=metadata)
        if run_requests:
            return SensorResult(run_requests=run_requests, asset_events=[observation], cursor=cursor)
        summary = f"oplog window {window.hours:.2f} h; at risk: {metadata['collections_at_risk']}"
        return SensorResult(skip_reason=summary, asset_events=[observation], cursor=cursor)

    return oplog_window


def build_sensors(interval_s: int, assets: CdcAssets, partitions: CdcPartitions) -> Sequence[SensorDefinition]:
    return [
        build_discovery_sensor(interval_s),
        build_signal_sensor(interval_s, assets),
        build_oplog_window_sensor(interval_s, assets, partitions),
    ]
