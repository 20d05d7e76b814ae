"""Sensors: collection discovery, the signaling collection, the oplog window, and slice windows left behind.

Each is built by a factory from the assets it serves, like the sensors Dagster integration libraries
ship, so a second connector gets its own set with its own keys. A sensor reads its connector's resources
from ``context.resources`` by key (``resource_of``); ``**_direct`` takes the same resources that a direct
call (``sensor(build_sensor_context(resources=...))``, as in a unit test) also hands over as keywords.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from bson import Timestamp, json_util
from dagster import (
    AddDynamicPartitionsRequest,
    AssetCheckEvaluation,
    AssetObservation,
    AssetSelection,
    DagsterInstance,
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
from dagster._time import get_current_datetime

from mongocdc_core.positions import Position
from mongocdc_core.source.errors import CdcError, HistoryLostError
from mongocdc_core.source.signals import SignalRead
from mongocdc_dagster.assets.cdc import CdcAssets, write_plan
from mongocdc_dagster.discovery import KEEP_DROPPED, DiscoveryError, DiscoveryState
from mongocdc_dagster.gaps import (
    GAP,
    MAX_REPAIRS,
    TAG_REASON,
    Holes,
    failed_repairs,
    judge,
    readable_oplog_start,
    repair_request,
)
from mongocdc_dagster.landed_history import needed_window_start
from mongocdc_dagster.logs import RUN_CONFIG
from mongocdc_dagster.metadata import position_time
from mongocdc_dagster.partitions import ranges_partitions_name
from mongocdc_dagster.resources import MongoCdcResource, resource_of
from mongocdc_dagster.retries import ACTIVE, RUN_RETRY_TAGS, in_flight
from mongocdc_dagster.snapshot_requests import (
    EXECUTE,
    SignalError,
    SnapshotSignal,
    parse_signal,
    signal_id_of,
)
from mongocdc_dagster.translator import CdcKind, tag_value

SIGNAL_BATCH = 100
#: Signals for collections the definitions do not have yet are held this long, then dropped with an error.
HOLD_FOR = timedelta(days=7)
MAX_HELD = 200
WARN_FRACTION = 0.25  # warn when a collection's next needed window is in the oldest quarter of the oplog
OBSERVE_EVERY_S = 300

TAG_KIND = "mongocdc/kind"
TAG_COLLECTION = "mongocdc/collection"
TAG_SIGNAL = "mongocdc/signal_id"
TAG_SIGNAL_POSITION = "mongocdc/signal_position"
TAG_SNAPSHOT_TYPE = "mongocdc/snapshot_type"


def _names(items: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def build_discovery_sensor(interval_s: int, state: DiscoveryState, cdc: CdcAssets, ranged: dict[str, int],
                           store: Callable[[DagsterInstance], None] | None = None) -> SensorDefinition:
    """Compares what MongoDB captures now with the collections the definitions were built for, keeps the
    stored defs state current (``store``: when the captured collections differ from the stored ones, so a
    load while MongoDB is unreachable builds the latest), and plans the ``_id`` ranges of ranged collections
    that have none yet. The cursor holds the collections last stored."""
    loaded = set(state.captured)  # the dropped collections' assets stay (discovery.KEEP_DROPPED)
    dropped = set(state.dropped)
    names = cdc.names

    @sensor(name=names.of("collection_discovery"), minimum_interval_seconds=interval_s,
            default_status=DefaultSensorStatus.RUNNING, required_resource_keys={names.mongocdc},
            description="Tells when captured collections differ from the loaded definitions (reload to pick "
                        "them up), keeps the stored defs state current, and plans the _id ranges of collections "
                        "snapshotted in ranges.")
    def discovery(context: SensorEvaluationContext, **_direct: object) -> SensorResult | SkipReason:
        mongocdc = resource_of(context, names.mongocdc, MongoCdcResource)
        try:
            now = set(mongocdc.captured_collections())
        except CdcError as exc:
            unknown = f"MongoDB did not answer, so the captured collections are unknown this tick: {exc}"
            return SkipReason(f"{unknown}; {state.stored_note}" if state.error else unknown)
        added, removed, back = sorted(now - loaded - dropped), sorted(loaded - now), sorted(now & dropped)
        stored = set(orjson.loads(context.cursor)) if context.cursor else loaded
        requests: list[AddDynamicPartitionsRequest | DeleteDynamicPartitionsRequest] = []
        planned: list[str] = []
        for namespace, split_size in sorted(ranged.items()):
            if namespace not in loaded or namespace not in now:
                continue
            name = ranges_partitions_name(namespace, names)
            if context.instance.get_dynamic_partitions(name):
                continue
            keys = write_plan(mongocdc, namespace, split_size)
            requests.append(AddDynamicPartitionsRequest(name, keys))
            planned.append(f"{namespace} into {len(keys)} _id range(s)")
        words: list[str] = []
        if state.error:
            words.append(state.stored_note)
        if added:
            words.append(f"{len(added)} captured collection(s) have no assets yet: {_names(added)}; reload the code "
                         "location to add them (snapshot signals for them are held until then)")
        if removed:
            words.append(f"{len(removed)} collection(s) with assets are no longer captured: {_names(removed)}; a "
                         "reload marks their assets dropped (they stay for their history and the retries of their "
                         f"runs, {KEEP_DROPPED.days} days; no new slices are requested for them)")
        if back:
            words.append(f"{len(back)} dropped collection(s) are captured again: {_names(back)}; reload the code "
                         "location to request their slices again")
        if store is not None and now != stored:
            try:
                store(context.instance)
                stored = now
                words.append(f"stored the {len(now)} captured collection(s) as the defs state a load builds when "
                             "MongoDB cannot be reached")
            except DiscoveryError as exc:
                words.append(f"the defs state could not be stored: {exc}")
        if planned:
            words.append(f"planned the snapshot ranges of {', '.join(planned)}")
        for line in words:
            context.log.warning(line) if (added or removed or back or state.error) else context.log.info(line)
        if not words:
            words.append(f"no change: MongoDB captures the same {len(now)} collection(s) the definitions were built "
                         f"for ({_names(sorted(now))})" if now else
                         "no change: the connector's filters capture no collection yet")
        return SensorResult(dynamic_partitions_requests=requests, skip_reason="; ".join(words),
                            cursor=orjson.dumps(sorted(stored)).decode())

    return discovery


# -- signals ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pending:
    """A signal read from the collection and not acted on yet (``held_since`` set: waiting for its collections)."""

    document: dict[str, Any]
    position: Position
    held_since: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"doc": json_util.dumps(self.document), "position": self.position.to_str(), "held_since": self.held_since}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Pending:
        return cls(json_util.loads(data["doc"]), Position.parse(data["position"]), data.get("held_since"))


def _after(read: SignalRead, fallback: Timestamp | None = None) -> Timestamp:
    """The cluster time a read without a resume token continues from: past what it read completely."""
    if read.complete or fallback is None:
        return Timestamp(read.until.time, read.until.inc + 1)
    return fallback


def _signal_cursor(token: dict[str, Any] | None, at: Timestamp, held: list[_Pending]) -> str:
    """Where the next tick continues: after ``token``, or (no token from the server) from cluster time ``at``."""
    return orjson.dumps({"token": json_util.dumps(token) if token else None, "at": [at.time, at.inc],
                         "held": [h.to_json() for h in held]}).decode()


def _run_snapshot_type(run_tags: dict[str, str], asset_selection: Any, cdc: CdcAssets) -> str | None:
    if TAG_SNAPSHOT_TYPE in run_tags:
        return run_tags[TAG_SNAPSHOT_TYPE]
    selection = set(asset_selection or ())
    if selection & set(cdc.keys_of("snapshot")):
        return "blocking"
    if selection & set(cdc.keys_of("incremental_snapshot")):
        return "incremental"
    return None


def _stop_runs(context: SensorEvaluationContext, signal: SnapshotSignal, cdc: CdcAssets) -> list[str]:
    """Cancel in-flight snapshot runs of the signal's type that snapshot a collection the signal matches."""
    owners = {**cdc.keys_of("snapshot"), **cdc.keys_of("incremental_snapshot")}
    stopped: list[str] = []
    for run in context.instance.get_runs(filters=RunsFilter(statuses=ACTIVE)):
        kind = _run_snapshot_type(dict(run.tags), run.asset_selection, cdc)
        if kind is None or kind != signal.snapshot_type:
            continue
        namespaces = {owners[k] for k in (run.asset_selection or ()) if k in owners}
        if not any(signal.matches(ns) for ns in namespaces):
            continue
        context.instance.run_coordinator.cancel_run(run.run_id)
        stopped.append(run.run_id)
    return stopped


def _snapshot_run(signal: SnapshotSignal, position: Position, namespaces: list[str], cdc: CdcAssets,
                  context: SensorEvaluationContext) -> list[RunRequest]:
    """One run for the signal (per range of a collection snapshotted in ranges, which fan out)."""
    kind: CdcKind = "incremental_snapshot" if signal.snapshot_type == "incremental" else "snapshot"
    op = cdc.names.of(kind)  # the op of the snapshot multi-asset of that kind
    filters = {ns: text for ns in namespaces if (text := signal.condition_for(ns)) is not None}
    tags = {TAG_KIND: kind, TAG_SIGNAL: signal.signal_id, TAG_SIGNAL_POSITION: position.to_str(), **RUN_RETRY_TAGS,
            TAG_SNAPSHOT_TYPE: signal.snapshot_type, TAG_COLLECTION: tag_value(_names(namespaces, 2))}
    config = {"filters": filters, "signal_id": signal.signal_id}
    plain = [ns for ns in namespaces if not (kind == "snapshot" and ns in cdc.ranged)]
    requests: list[RunRequest] = []
    if plain:
        requests.append(RunRequest(
            run_key=f"signal:{position.to_str()}", asset_selection=[cdc.key(ns, kind) for ns in plain],
            run_config={**RUN_CONFIG, "ops": {op: {"config": config}}}, tags=tags,
        ))
    for ns in namespaces:
        if ns in plain:
            continue
        definition = cdc.ranged[ns]
        name = definition.op.name
        for key in context.instance.get_dynamic_partitions(ranges_partitions_name(ns, cdc.names)):
            requests.append(RunRequest(
                run_key=f"signal:{position.to_str()}:{key}", asset_selection=[cdc.key(ns, "snapshot")], partition_key=key,
                run_config={**RUN_CONFIG, "ops": {name: {"config": config}}}, tags={**tags, TAG_COLLECTION: tag_value(ns)},
            ))
    return requests


def build_signal_sensor(interval_s: int, cdc: CdcAssets) -> SensorDefinition:
    """Turns execute-snapshot / stop-snapshot signals into runs / cancellations: one run per signal.

    The signaling collection is followed by its change stream (the cursor holds the resume token), so
    signals are taken in the order they were inserted, whatever the type of their ``_id``; the run key is
    the insert's position, so a signal launches once. The first tick starts from now (like Debezium's
    source channel, signals sent before the sensor started are not replayed). A signal naming a
    collection the definitions do not have yet (new, or not captured) is logged and held in the cursor
    until the code location is reloaded with it, for up to HOLD_FOR.
    """

    snapshots = [*cdc.keys_of("snapshot"), *cdc.keys_of("incremental_snapshot")]

    @sensor(name=cdc.names.of("signals"), minimum_interval_seconds=interval_s, default_status=DefaultSensorStatus.RUNNING,
            target=AssetSelection.assets(*snapshots) if snapshots else None, required_resource_keys={cdc.names.mongocdc},
            description="Reads Debezium snapshot signals from signal.data.collection, in insert order.")
    def signals(context: SensorEvaluationContext, **_direct: object) -> SensorResult | SkipReason:
        mongocdc = resource_of(context, cdc.names.mongocdc, MongoCdcResource)
        cfg = mongocdc.load_config()
        if not cfg.signal_data_collection:
            return SkipReason("signal.data.collection is not set in the connector config")
        if "source" not in cfg.signal_enabled_channels:
            return SkipReason(f"the source signal channel is not enabled ({', '.join(cfg.signal_enabled_channels)})")
        previous = orjson.loads(context.cursor) if context.cursor else None
        if not isinstance(previous, dict) or "at" not in previous:  # first tick, or a cursor of an older version
            read = mongocdc.read_signals(cfg, limit=0)
            return SensorResult(skip_reason="started: signals inserted from now on are acted on",
                                cursor=_signal_cursor(read.resume_token, _after(read), []))
        token = json_util.loads(previous["token"]) if previous.get("token") else None
        at = Timestamp(*previous["at"])
        held = [_Pending.from_json(h) for h in previous.get("held", [])]
        notes: list[str] = []
        try:
            read = mongocdc.read_signals(cfg, resume_after=token, start_at=None if token else at, limit=SIGNAL_BATCH)
        except HistoryLostError as exc:
            message = (f"signals inserted while the sensor was not reading left the oplog and are lost ({exc}); "
                       "following the signaling collection from now")
            context.log.error(message)
            read = mongocdc.read_signals(cfg, limit=0)
            return SensorResult(skip_reason=message, cursor=_signal_cursor(read.resume_token, _after(read), held))
        pending = held + [_Pending(i.document, i.position) for i in read.inserts]
        captured: list[str] | None = None
        loaded = set(cdc.namespaces)
        still_held: list[_Pending] = []
        run_requests: list[RunRequest] = []
        now = time.time()
        for item in pending:
            doc_id = signal_id_of(item.document)
            try:
                signal = parse_signal(item.document)
            except SignalError as exc:
                context.log.warning(f"malformed signal skipped: {exc}")
                notes.append(f"malformed signal {doc_id}: {exc}")
                continue
            if signal is None:
                notes.append(f"signal {doc_id} of type {item.document.get('type')!r} is not for Dagster")
                continue
            if signal.action != EXECUTE:
                stopped = _stop_runs(context, signal, cdc)
                context.log.info(f"stop-snapshot {doc_id}: cancelled {len(stopped)} run(s) {stopped}")
                notes.append(f"stop-snapshot {doc_id} cancelled {len(stopped)} run(s)")
                continue
            if captured is None:
                captured = mongocdc.captured_collections(cfg)
            matched = signal.matching(captured)
            missing = [ns for ns in matched if ns not in loaded] + signal.unmatched_names(captured)
            if missing or not matched:
                waited = 0.0 if item.held_since is None else now - item.held_since
                what = (f"names {_names(missing)}, which the definitions do not have yet" if missing else
                        "matches no captured collection")
                if waited > HOLD_FOR.total_seconds():
                    context.log.error(f"signal {doc_id} dropped after being held {HOLD_FOR.days} days: it {what}")
                    notes.append(f"signal {doc_id} dropped: it {what}")
                    continue
                if item.held_since is None:
                    context.log.warning(f"signal {doc_id} {what}; held until the code location is reloaded with "
                                        "its collections")
                still_held.append(_Pending(item.document, item.position, item.held_since or now))
                notes.append(f"signal {doc_id} held: it {what}")
                continue
            requests = _snapshot_run(signal, item.position, matched, cdc, context)
            run_requests += requests
            context.log.info(f"execute-snapshot {doc_id} (inserted at {position_time(item.position)}): "
                             f"{signal.snapshot_type} snapshot of {_names(matched)}")
        if len(still_held) > MAX_HELD:
            dropped = still_held[:-MAX_HELD]
            context.log.error(f"{len(dropped)} held signal(s) dropped: more than {MAX_HELD} are waiting")
            still_held = still_held[-MAX_HELD:]
        cursor = _signal_cursor(read.resume_token or token, _after(read, at), still_held)
        if run_requests:
            return SensorResult(run_requests=run_requests, cursor=cursor)
        text = "; ".join(notes) or ("no new signals" if read.complete else
                                    "no new signals yet (the signaling collection's stream has not reached now)")
        return SensorResult(skip_reason=text, cursor=cursor)

    return signals


# -- the oplog window -----------------------------------------------------------------------------------


def build_oplog_window_sensor(interval_s: int, cdc: CdcAssets) -> SensorDefinition:
    """Watches the oplog window against each collection's landed history.

    A collection's next slice must start where its landed history ends (after its last window, or at
    its snapshot position when that is newer). When that point is in the oldest WARN_FRACTION of the
    oplog it warns; when it has left the oplog the changes in between are lost, and only then it
    requests a new snapshot of that collection. Collections never snapshotted have nothing to lose.
    On a sharded cluster every shard's oplog is read (from the shard: mongos has no ``local``), as
    an operator's monitoring does, and each warning names the shard whose oplog it is about: a
    stream through mongos needs the history of every shard.
    """

    snapshots = list(cdc.keys_of("snapshot"))

    @sensor(name=cdc.names.of("oplog_window"), minimum_interval_seconds=interval_s,
            default_status=DefaultSensorStatus.RUNNING, target=AssetSelection.assets(*snapshots) if snapshots else None,
            required_resource_keys={cdc.names.mongocdc},
            description="Oplog window size (each shard's on a sharded cluster) and per-collection lag; re-snapshots "
                        "a collection only after a real gap.")
    def oplog_window(context: SensorEvaluationContext, **_direct: object) -> SensorResult:
        mongocdc = resource_of(context, cdc.names.mongocdc, MongoCdcResource)
        windows = mongocdc.oplog_windows()
        for name, why in sorted(windows.unreadable.items()):
            context.log.warning(f"{name}: its oplog window cannot be read ({why}); history lost there is found "
                                "only when the stream resumes")
        window = windows.common
        if window is None:
            return SensorResult(skip_reason="no oplog window could be read: " + "; ".join(
                f"{name}: {why}" for name, why in sorted(windows.unreadable.items())))
        sharded = windows.sharded
        firsts = {name: datetime.fromtimestamp(w.first.time, UTC) for name, w in windows.windows.items()}
        margins = {name: timedelta(seconds=max(cdc.windows.seconds, w.hours * 3600 * WARN_FRACTION))
                   for name, w in windows.windows.items()}
        now = datetime.now(UTC)
        first = datetime.fromtimestamp(window.first.time, UTC)
        last = datetime.fromtimestamp(window.last.time, UTC)
        previous = orjson.loads(context.cursor) if context.cursor else None
        growth: float | None = None
        if previous is not None and now.timestamp() > previous["at"]:
            growth = (window.size_bytes - previous["size"]) / ((now.timestamp() - previous["at"]) / 3600)
        lost: dict[str, list[str]] = {}  # collection -> the replica sets / shards whose oplog no longer has its history
        at_risk: dict[str, list[str]] = {}
        lags: dict[str, float] = {}
        run_requests: list[RunRequest] = []
        for namespace, history in cdc.histories(context.instance, cdc.namespaces).items():
            if history.window_keys:
                lags[namespace] = round((now - cdc.windows.window(history.window_keys[-1]).end).total_seconds(), 1)
            needed = needed_window_start(history, cdc.windows)
            if needed is None or namespace in cdc.dropped:  # a dropped collection's history ended with it
                continue
            if lost_on := [name for name, start in sorted(firsts.items()) if needed < start]:
                lost[namespace] = lost_on
                if namespace in cdc.ranged:
                    context.log.error(f"{namespace}: history lost; plan its ranges again and backfill them")
                    continue
                run_requests.append(RunRequest(
                    run_key=f"resnapshot:{namespace}:{int(needed.timestamp())}",
                    asset_selection=[cdc.key(namespace, "snapshot")], run_config=RUN_CONFIG,
                    tags={TAG_KIND: "snapshot", TAG_COLLECTION: tag_value(namespace), TAG_REASON: "history_lost",
                          **RUN_RETRY_TAGS},
                ))
            elif risky := [name for name, start in sorted(firsts.items()) if needed - start < margins[name]]:
                at_risk[namespace] = risky

        def of(name: str) -> str:
            return f" of shard {name}" if sharded else ""

        for namespace, names in at_risk.items():
            for name in names:
                context.log.warning(
                    f"{namespace}: its next window to land starts close to the oplog start{of(name)} "
                    f"({firsts[name].isoformat()}); land its slices soon or its history will be lost")
        for namespace, names in lost.items():
            for name in names:
                context.log.error(f"{namespace}: changes not landed have left the oplog{of(name)} (it starts at "
                                  f"{firsts[name].isoformat()}); requesting a new snapshot")
        observe = previous is None or now.timestamp() - previous.get("observed", 0) >= OBSERVE_EVERY_S or lost or at_risk
        events: list[AssetObservation] = []
        if observe:
            common: dict[str, Any] = {
                "oplog_window_hours": round(window.hours, 4),
                "oplog_first": MetadataValue.timestamp(first),
                "oplog_last": MetadataValue.timestamp(last),
                "oplog_size_bytes": window.size_bytes,
                "oplog_max_bytes": window.max_bytes,
                "oplog_growth_bytes_per_hour": None if growth is None else round(growth, 1),
            }
            if sharded:
                common["oplog_shards"] = MetadataValue.json({
                    name: {"first": firsts[name].isoformat(), "hours": round(w.hours, 4), "size_bytes": w.size_bytes}
                    for name, w in sorted(windows.windows.items())} | {
                    name: {"unreadable": why} for name, why in sorted(windows.unreadable.items())})
            for namespace in cdc.namespaces:
                events.append(AssetObservation(asset_key=cdc.key(namespace, "slices"), metadata={
                    **common, "lag_s": lags.get(namespace), "history_lost": namespace in lost,
                    "at_risk": namespace in at_risk}))
        cursor = orjson.dumps({"at": now.timestamp(), "size": window.size_bytes,
                               "observed": now.timestamp() if observe else previous.get("observed", 0) if previous else 0
                               }).decode()
        if run_requests:
            return SensorResult(run_requests=run_requests, asset_events=events, cursor=cursor)
        shards = f" (the part all {len(windows.windows)} shards hold)" if sharded else ""
        summary = (f"oplog window {window.hours:.2f} h{shards}; no collection lost history"
                   + (f"; at risk: {_names(list(at_risk))}" if at_risk else "")
                   + ("" if not lost else f"; lost (ranged, see log): {_names(list(lost))}")
                   + ("" if not windows.unreadable else f"; unreadable: {_names(sorted(windows.unreadable))}"))
        return SensorResult(skip_reason=summary, asset_events=events, cursor=cursor)

    return oplog_window


def build_slice_gaps_sensor(interval_s: int, cdc: CdcAssets) -> SensorDefinition:
    """Windows a failed slice run left behind (``gaps.py``): requests those the oplog still holds again, one hole
    per run, with a back-off, a bounded number of times, and reports the collection's continuity check when the
    windows it cannot land change (ERROR; passing again once they are gone; the cursor holds those reported).
    Nothing is requested for a dropped collection or one the filters now leave out, nor while the oplog cannot
    be read. It targets the slices as the latest-window schedule does (one partitions definition: a target
    mixing the snapshots' would not resolve its runs' windows)."""

    slices = list(cdc.keys_of("slices"))

    @sensor(name=cdc.names.of("slice_gaps"), minimum_interval_seconds=interval_s,
            default_status=DefaultSensorStatus.RUNNING, target=AssetSelection.assets(*slices) if slices else None,
            required_resource_keys={cdc.names.mongocdc},
            description=f"Lands again the windows failed slice runs left behind while the oplog holds them "
                        f"({MAX_REPAIRS} tries each, spread out), and fails no_gap_since_snapshot (ERROR) for "
                        "those that cannot be landed.")
    def slice_gaps(context: SensorEvaluationContext, **_direct: object) -> SensorResult | SkipReason:
        mongocdc = resource_of(context, cdc.names.mongocdc, MongoCdcResource)
        oplog_first = readable_oplog_start(mongocdc)
        if oplog_first is None:  # an outage: repairs now would only use their attempts up
            return SkipReason("the oplog cannot be read: no window is requested again, nor judged, this tick")
        cfg = mongocdc.load_config()
        now = get_current_datetime()
        failed = failed_repairs(context.instance, cdc.windows)
        reported: dict[str, list[str]] = orjson.loads(context.cursor) if context.cursor else {}
        unlandable: dict[str, list[str]] = {}
        due: dict[str, Holes] = {}
        waiting: list[str] = []
        verdicts: list[AssetCheckEvaluation] = []
        for namespace, history in cdc.histories(context.instance, cdc.namespaces).items():
            verdict = judge(cdc, history, now, oplog_first, failed)
            holes = verdict.holes
            if holes.landable and cfg.collection_included(*namespace.split(".", 1)):
                if holes.due:
                    due[namespace] = holes
                else:
                    waiting.append(namespace)
            if holes.lost:
                unlandable[namespace] = sorted(holes.lost)
            if unlandable.get(namespace, []) != reported.get(namespace, []):  # once per change, not every tick
                (context.log.error if holes.lost else context.log.info)(verdict.description)
                verdicts.append(verdict.evaluation(cdc.key(namespace, "slices")))
        cursor = orjson.dumps(unlandable).decode()
        newest = context.instance.get_runs(filters=RunsFilter(tags={TAG_REASON: GAP}), limit=1)
        busy = newest[0] if newest and in_flight(newest[0]) else None
        if due and busy is None:
            request = repair_request(due, cdc, newest[0].run_id if newest else None, {TAG_KIND: "slices"})
            return SensorResult(run_requests=[request], asset_events=verdicts, cursor=cursor)
        summary = ("no window left behind" if not due and not waiting and not unlandable else "; ".join(filter(None, (
            f"windows left behind, requested again: {_names(list(due))}" if due else "",
            f"windows whose repair failed, requested again after a pause: {_names(waiting)}" if waiting else "",
            f"a run landing them is in flight ({busy.run_id})" if due and busy else "",
            f"windows that cannot be landed: {_names(list(unlandable))}" if unlandable else ""))))
        return SensorResult(skip_reason=summary, asset_events=verdicts, cursor=cursor)

    return slice_gaps


def build_sensors(interval_s: int, state: DiscoveryState, cdc: CdcAssets, ranged: dict[str, int],
                  store: Callable[[DagsterInstance], None] | None = None) -> list[SensorDefinition]:
    return [
        build_discovery_sensor(interval_s, state, cdc, ranged, store),
        build_signal_sensor(interval_s, cdc),
        build_oplog_window_sensor(interval_s, cdc),
        build_slice_gaps_sensor(interval_s, cdc),
    ]

