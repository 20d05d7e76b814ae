"""The CDC assets, one per collection and kind: snapshot, incremental_snapshot and slices.

Each kind is one subsettable ``@multi_asset`` over every discovered collection, so one run serves any
selection: the schedule's run lands the closed window of every collection from one change stream, a
backfill of many windows of one collection runs once (``BackfillPolicy.single_run``) and still writes
one file per window. A collection listed in ``ranged_snapshots`` has a snapshot asset of its own,
partitioned by ``_id`` range, so a backfill copies its ranges as separate runs in parallel.

Every materialisation writes exactly one Parquet file per partition (``ParquetSink.to_file``: a temp
file renamed at close), so a re-run replaces its file and a failed run leaves the previous one.

No ``from __future__ import annotations`` here: Dagster reads the annotations (Config, resources) at
definition time and cannot resolve them from strings.
"""

import hashlib
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from bson import Timestamp, json_util
from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetMaterialization,
    AssetsDefinition,
    AssetSpec,
    BackfillPolicy,
    Config,
    DagsterInstance,
    Failure,
    MaterializeResult,
    MetadataValue,
    TimeWindow,
    multi_asset,
)
from pydantic import Field

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.positions import Position
from mongocdc_core.progress_log import LogProgress
from mongocdc_core.sinks.base import Sink
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.sinks.tee import TeeSink
from mongocdc_core.source.errors import HistoryLostError
from mongocdc_core.source.ranges import IdRange
from mongocdc_dagster.discovery import KEEP_DROPPED, DiscoveryState
from mongocdc_dagster.landed_history import (
    COVERS_FROM,
    PARTIAL,
    CollectionHistory,
    HistorySource,
    collection_histories,
    snapshot_positions,
)
from mongocdc_dagster.landing_checks import (
    EnvelopeReport,
    Expectation,
    count_rows_at,
    live_keys,
    validate_file,
)
from mongocdc_dagster.metadata import metrics_metadata, position_metadata, position_time
from mongocdc_dagster.naming import DEFAULT_NAMES, ConnectorNames
from mongocdc_dagster.partitions import SliceWindows, ranges_partitions
from mongocdc_dagster.pools import Pools
from mongocdc_dagster.resources import (
    PLAN_FILE,
    RANGES_PREFIX,
    MongoCdcKafkaResource,
    MongoCdcResource,
    resource_of,
)
from mongocdc_dagster.retries import STEP_RETRY_POLICY, stop_when_terminated
from mongocdc_dagster.routing import RouteTarget, WindowRouter
from mongocdc_dagster.settings import CdcSettings
from mongocdc_dagster.translator import (
    CDC_KINDS,
    NEW_DATA,
    CdcKind,
    MongoCdcAssetProps,
    MongoCdcTranslator,
    name_part,
)

ENVELOPE_CHECK = "landing_envelopes"
COUNT_CHECK = "source_count"
#: The metadata entry of a dropped collection's assets: when discovery found it gone.
DROPPED_AT = "mongocdc/dropped_at"


class SnapshotConfig(Config):  # type: ignore[misc]
    """Run config a signal-triggered snapshot carries (empty for a plain run)."""

    filters: dict[str, str] = Field(
        default_factory=dict, description="collection -> MongoDB query (extended JSON) selecting the documents to copy"
    )
    signal_id: str | None = Field(default=None, description="the execute-snapshot signal that asked for this run")


class _CountingSink:
    """Counts change events by op without keeping them (for the count check's correction)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def write(self, records: Sequence[Record]) -> None:
        for record in records:
            if record.op is not None:
                self.counts[record.op] = self.counts.get(record.op, 0) + 1

    def flush(self, timeout: float | None = None) -> None:
        return None

    def close(self) -> None:
        return None


def parse_filter(text: str | None) -> dict[str, Any] | None:
    """A snapshot filter from extended JSON text; a clear error when it is not a JSON object."""
    if text is None or not text.strip():
        return None
    try:
        value = json_util.loads(text)
    except (ValueError, TypeError) as exc:
        raise Failure(f"snapshot filter {text!r} is not (extended) JSON: {exc}", allow_retries=False) from None
    if not isinstance(value, dict):
        raise Failure(f"snapshot filter {text!r} must be a JSON object (a MongoDB query)", allow_retries=False)
    return value


def snapshot_file_name(filter_text: str | None) -> str:
    """`snapshot` for a full copy; filtered copies get their own file so they never replace the full one."""
    if filter_text is None or not filter_text.strip():
        return "snapshot"
    return "filtered-" + hashlib.sha1(filter_text.strip().encode()).hexdigest()[:12]


@contextmanager
def landing_sink(path: Path, kafka: MongoCdcKafkaResource, cfg: ConnectorConfig) -> Iterator[Sink]:
    """A partition's single landing file (and Kafka when configured): moved into place when the block
    succeeds, discarded when it fails, so a failed run never replaces the previous file."""
    parquet = ParquetSink.to_file(path)
    sink: Sink = TeeSink([parquet, kafka.open_sink(cfg)]) if kafka.enabled else parquet
    try:
        yield sink
        sink.close()
    except BaseException:
        parquet.abort()
        raise


def _require_captured(mongocdc: MongoCdcResource, cfg: ConnectorConfig, namespaces: Sequence[str]) -> None:
    captured = set(mongocdc.captured_collections(cfg))
    missing = [ns for ns in namespaces if ns not in captured]
    if missing:
        raise Failure(
            f"collection(s) {', '.join(repr(ns) for ns in missing)} not captured by {mongocdc.describe} "
            f"(captured now: {', '.join(sorted(captured)) or 'none'}); check the include/exclude lists, or "
            "reload the code location if a collection was dropped",
            allow_retries=False,
        )


def _included(context: AssetExecutionContext, cfg: ConnectorConfig, namespaces: Sequence[str]) -> list[str]:
    """Slices need the filters to capture a collection, not the collection to exist: one dropped inside a
    window has its changes up to the drop there (and the schedule names it for the windows begun before
    discovery found it gone). One the filters now leave out (the definitions not reloaded yet) is skipped with
    a warning, so the others still land."""
    included = [ns for ns in namespaces if cfg.collection_included(*ns.split(".", 1))]
    if excluded := sorted(set(namespaces) - set(included)):
        context.log.warning(f"skipped: {', '.join(excluded)}: the include/exclude lists leave them out (reload the "
                            "code location to drop their assets)")
    return included


def _token_json(token: Mapping[str, Any] | None) -> str | None:
    return None if token is None else json_util.dumps(token)


def envelope_result(key: AssetKey, report: EnvelopeReport, what: str = "") -> AssetCheckResult:
    return AssetCheckResult(
        asset_key=key,
        check_name=ENVELOPE_CHECK,
        passed=report.passed,
        description=f"{report.rows} rows{what}, {report.invalid} invalid",
        metadata={"rows": report.rows, "invalid_rows": report.invalid,
                  "problems": MetadataValue.md("\n".join(f"- {p}" for p in report.problems) or "none")},
    )


def source_count_result(
    key: AssetKey,
    mongocdc: MongoCdcResource,
    cfg: ConnectorConfig,
    namespace: str,
    in_file: int,
    position: Position,
    filter_doc: dict[str, Any] | None,
) -> AssetCheckResult:
    """The documents a snapshot file implies at `position` vs the source count, corrected for writes since.

    The source is counted now; when that differs from the file, the inserts and deletes between the
    snapshot position and now are read from the oplog, so `now - inserts + deletes` is the exact count
    at the snapshot position (for a filtered snapshot, updates can move documents in or out of the
    filter, so a difference there is a warning, not proof of loss).
    """
    db, _, coll = namespace.partition(".")
    client = mongocdc.client()
    try:
        now = client[db][coll].count_documents(filter_doc or {})
    finally:
        client.close()
    metadata: dict[str, Any] = {"documents_in_file": in_file, "source_count_now": now,
                                "position": position_time(position)}
    if in_file == now:
        return AssetCheckResult(asset_key=key, check_name=COUNT_CHECK, passed=True, metadata=metadata,
                                description=f"{in_file} documents, as in the source")
    counter = _CountingSink()
    now_ts = mongocdc.cluster_time(cfg)
    # the window is half-open: end one increment past now so a write at exactly `now` is counted
    mongocdc.stream_window(cfg, [namespace], position.timestamp, Timestamp(now_ts.time, now_ts.inc + 1), counter)
    inserts, deletes = counter.counts.get("c", 0), counter.counts.get("d", 0)
    expected = now - inserts + deletes
    metadata.update({"inserts_since": inserts, "deletes_since": deletes, "expected_at_position": expected})
    passed = expected == in_file
    explanation = (
        f"{now} documents now; {inserts} inserted and {deletes} deleted since the snapshot position, "
        f"so {expected} existed at it; the snapshot holds {in_file}"
        + ("" if filter_doc is None else " (filtered: updates may move documents across the filter)")
    )
    metadata["explanation"] = explanation
    return AssetCheckResult(
        asset_key=key, check_name=COUNT_CHECK, passed=passed, metadata=metadata, description=explanation,
        severity=AssetCheckSeverity.WARN if filter_doc is not None else AssetCheckSeverity.ERROR,
    )


def remove_superseded(mongocdc: MongoCdcResource, namespace: str, keep: Path) -> list[str]:
    """After a full snapshot landed (``keep``: its file or its plan folder), delete the collection's other
    full snapshots (``snapshot.parquet``, older range plans): the tables drop their rows, so a document
    deleted while history was lost cannot come back from an old snapshot. Filtered snapshots stay."""
    removed: list[str] = []
    folder = mongocdc.snapshot_dir(namespace)
    if not folder.is_dir():
        return removed
    for entry in folder.iterdir():
        if entry == keep:
            continue
        if entry.is_dir() and entry.name.startswith(RANGES_PREFIX):
            shutil.rmtree(entry)
            removed.append(str(entry))
        elif entry.name == "snapshot.parquet":
            entry.unlink()
            removed.append(str(entry))
    return removed


# -- stream windows and what may be read of them -------------------------------------------------------


def _ts(when: datetime) -> Timestamp:
    return Timestamp(int(when.timestamp()), 0)


def _key(ts: Timestamp) -> tuple[int, int]:
    return (ts.time, ts.inc)


@dataclass(frozen=True)
class WindowRead:
    """How one window of one collection is read: from ``start`` (the window start, the snapshot position
    when the start left the oplog, or the oplog's start before the collection's capture began), or not at
    all (``gap``: a real loss of history)."""

    window_key: str
    window: TimeWindow
    start: Timestamp
    from_snapshot: Position | None = None
    gap: str | None = None
    before_capture: bool = False

    @property
    def end(self) -> Timestamp:
        return _ts(self.window.end)

    def read_from(self) -> str:
        if self.before_capture:
            oplog = position_time(Position.from_timestamp(self.start))
            return (f"the oplog's start {oplog}: the window's start left the oplog before the collection's capture "
                    "began (no snapshot, no slice before this window), so nothing was lost; its first snapshot "
                    "covers what came before")
        if self.from_snapshot is None:
            return "window start"
        if _key(self.from_snapshot.timestamp) >= _key(self.end):
            return (f"nothing: the window's start left the oplog, and the collection's snapshot at "
                    f"{position_time(self.from_snapshot)} is after the window, so it covers the window")
        return (f"the snapshot position {position_time(self.from_snapshot)}: the window's start left the oplog, "
                "and the snapshot covers what came before it")


def left_oplog(window: TimeWindow, oplog_first: Timestamp) -> bool:
    """Whether the window's start has left the oplog (its first entry, ``oplog_first``, is later)."""
    return _key(_ts(window.start)) < _key(oplog_first)


def plan_window_read(window_key: str, window: TimeWindow, oplog_first: Timestamp,
                     snapshots: Sequence[Position], *, landed_before: bool) -> WindowRead:
    """A window reads from its start while the oplog holds it. When the start has left the oplog, a snapshot
    of the collection (``snapshots``: the positions its snapshots cover it from) covers the window if its
    position is inside or after the window and the oplog still holds it: the window reads from the oldest such
    snapshot's position (a later one, an incremental snapshot taken since, would skip the changes made between
    the two). Before the collection's capture began (no snapshot, no slice landed before the window: a fresh
    deployment) nothing can have been lost: it reads from the oplog's start. Anything else is a real gap."""
    start = _ts(window.start)
    if not left_oplog(window, oplog_first):
        return WindowRead(window_key, window, start)
    if not snapshots and not landed_before:
        first = min(oplog_first, _ts(window.end), key=_key)
        return WindowRead(window_key, window, first, before_capture=True)
    held = [p for p in snapshots if _key(p.timestamp) >= _key(oplog_first)]  # so inside or after the window
    if held:
        snapshot = min(held)
        if _key(snapshot.timestamp) >= _key(_ts(window.end)):
            return WindowRead(window_key, window, _ts(window.end), from_snapshot=snapshot)
        return WindowRead(window_key, window, snapshot.timestamp, from_snapshot=snapshot)
    oplog = datetime.fromtimestamp(oplog_first.time, UTC).isoformat()
    newest = max(snapshots, default=None)
    why = ("the collection has no snapshot" if newest is None else
           f"its snapshot at {position_time(newest)} is older than the window" if _key(newest.timestamp) < _key(start)
           else f"its snapshot at {position_time(newest)} is older than the oplog")
    return WindowRead(window_key, window, start, gap=(
        f"history lost: the oplog starts at {oplog}, after the window's start {window.start.isoformat()}, and {why}; "
        "snapshot the collection again (its snapshot then covers the lost window)"))


# -- the assets ------------------------------------------------------------------------------------------


@dataclass
class CdcAssets:
    """The CDC asset definitions and, per collection, the keys of its kinds."""

    windows: SliceWindows
    definitions: list[AssetsDefinition] = field(default_factory=list)
    keys: dict[tuple[str, CdcKind], AssetKey] = field(default_factory=dict)
    ranged: dict[str, AssetsDefinition] = field(default_factory=dict)
    snapshot: AssetsDefinition | None = None
    incremental_snapshot: AssetsDefinition | None = None
    slices: AssetsDefinition | None = None
    names: ConnectorNames = DEFAULT_NAMES
    #: Dropped collection -> when discovery found it gone (its assets stay, see discovery.py).
    dropped: dict[str, datetime] = field(default_factory=dict)

    @property
    def pools(self) -> Pools:
        return Pools.of(self.names)

    def key(self, namespace: str, kind: CdcKind) -> AssetKey:
        return self.keys[(namespace, kind)]

    def keys_of(self, kind: CdcKind) -> dict[AssetKey, str]:
        """Asset key -> namespace for one kind."""
        return {key: ns for (ns, k), key in self.keys.items() if k == kind}

    def snapshot_keys(self, namespace: str) -> list[AssetKey]:
        """Both snapshot kinds of a collection: either one covers it."""
        return [self.key(namespace, "snapshot"), self.key(namespace, "incremental_snapshot")]

    @property
    def namespaces(self) -> list[str]:
        return sorted({ns for ns, _ in self.keys})

    def histories(self, instance: DagsterInstance, namespaces: Sequence[str]) -> dict[str, CollectionHistory]:
        """The landed histories of ``namespaces`` (one storage query for all of them when none changed)."""
        return collection_histories(instance, [
            HistorySource(ns, tuple(self.snapshot_keys(ns)), self.key(ns, "slices")) for ns in namespaces],
            self.windows)


def collection_props(kind: CdcKind, namespace: str, cfg: ConnectorConfig, settings: CdcSettings,
                     state: DiscoveryState) -> MongoCdcAssetProps:
    db, _, coll = namespace.partition(".")
    landing = {"snapshot": "snapshot", "incremental_snapshot": "incremental_snapshot", "slices": "stream_slice"}
    sizes = {c.namespace: c.estimated_documents for c in state.collections}
    return MongoCdcAssetProps(
        kind=kind, namespace=namespace, connector_name=cfg.name or cfg.topic_prefix,
        topic=cfg.topic_naming().data_change_topic(db, coll),
        landing_dir=str(settings.landing_dir / landing.get(kind, "")), table_root=settings.tables_root,
        slice_seconds=settings.granularity.seconds, estimated_documents=sizes.get(namespace),
    )


def _selected_copies(
    context: AssetExecutionContext, config: SnapshotConfig, mongocdc: MongoCdcResource, cfg: ConnectorConfig,
    ns_of: Mapping[AssetKey, str],
) -> list[tuple[AssetKey, str, str | None, dict[str, Any] | None]]:
    """The selected collections of a snapshot run in name order (all captured, else a clear failure), each
    with its filter as the user wrote it and parsed."""
    selected = sorted(context.selected_asset_keys, key=lambda k: ns_of[k])
    _require_captured(mongocdc, cfg, [ns_of[k] for k in selected])
    copies = []
    for key in selected:
        text = config.filters.get(ns_of[key])
        copies.append((key, ns_of[key], text, parse_filter(text)))
    return copies


def _selected_checks(context: AssetExecutionContext) -> set[AssetCheckKey]:
    return set(context.selected_asset_check_keys)


def build_cdc_assets(
    settings: CdcSettings, cfg: ConnectorConfig, state: DiscoveryState, translator: MongoCdcTranslator,
) -> CdcAssets:
    """One asset per discovered collection and CDC kind; keys, groups, tags and metadata from ``translator``."""
    windows = SliceWindows.build(settings, state)
    names = settings.names
    out = CdcAssets(windows, names=names, dropped=state.dropped)
    specs: dict[CdcKind, list[AssetSpec]] = {kind: [] for kind in CDC_KINDS}
    ns_of: dict[AssetKey, str] = {}
    for namespace in state.namespaces:
        for kind in CDC_KINDS:
            spec = mark_dropped(translator.get_asset_spec(collection_props(kind, namespace, cfg, settings, state)),
                                state, namespace)
            out.keys[(namespace, kind)] = spec.key
            ns_of[spec.key] = namespace
            if kind == "snapshot" and namespace in settings.ranged:
                out.ranged[namespace] = _ranged_snapshot_asset(spec, namespace, state, names)
                continue
            specs[kind].append(spec)
    totals = {c.namespace: c.estimated_documents for c in state.collections}
    if specs["snapshot"]:
        out.snapshot = _copy_asset(_COPY_KINDS["snapshot"], specs["snapshot"], ns_of, totals, names)
    if specs["incremental_snapshot"]:
        out.incremental_snapshot = _copy_asset(_COPY_KINDS["incremental_snapshot"], specs["incremental_snapshot"], ns_of,
                                               totals, names)
    if specs["slices"]:
        out.slices = _slices_asset(specs["slices"], ns_of, out, windows)
    out.definitions = [d for d in (out.snapshot, out.incremental_snapshot, out.slices) if d is not None]
    out.definitions += list(out.ranged.values())
    return out


def mark_dropped(spec: AssetSpec, state: DiscoveryState, namespace: str) -> AssetSpec:
    """A dropped collection's asset says so (its description, ``mongocdc/dropped_at``), and has no freshness
    policy nor automation: nothing lands for it any more, and that is not a failure."""
    dropped_at = state.dropped.get(namespace)
    if dropped_at is None:
        return spec
    note = (f"DROPPED: {namespace} is no longer captured since {dropped_at.isoformat(timespec='seconds')}; its "
            "assets stay for its history and the retries of its runs, and are removed at the first reload of "
            f"the definitions after {(dropped_at + KEEP_DROPPED).isoformat(timespec='seconds')}. No new slices "
            "are requested for it (but for windows begun before the drop).")
    return spec.replace_attributes(description=f"{note}\n\n{spec.description or ''}".strip(), freshness_policy=None,
                                   automation_condition=None).merge_attributes(metadata={DROPPED_AT: dropped_at.isoformat()})


def _collection_meta(key: AssetKey, namespace: str) -> dict[str, Any]:
    return {"collection": namespace}


@dataclass(frozen=True)
class _Landed:
    """What one snapshot copy landed, in the terms its asset reports: the kind's own metadata, what its
    records must look like, and the documents its source-count check compares (read only when selected)."""

    metadata: dict[str, Any]
    expectation: Expectation
    position: Position
    documents_in_file: Callable[[], int]


@dataclass(frozen=True)
class _CopyKind:
    """How a snapshot kind copies a collection into its landing file; the asset around it is shared."""

    kind: CdcKind
    label: str
    description: str
    envelope: str
    count: str
    path: Callable[[MongoCdcResource, str, str], Path]
    land: Callable[[MongoCdcResource, MongoCdcKafkaResource, ConnectorConfig, str, Path, dict[str, Any] | None,
                    ConnectorMetrics, LogProgress], _Landed]


def _land_snapshot(mongocdc: MongoCdcResource, kafka: MongoCdcKafkaResource, cfg: ConnectorConfig, namespace: str,
                   path: Path, filter_doc: dict[str, Any] | None, metrics: ConnectorMetrics,
                   progress: LogProgress) -> _Landed:
    with landing_sink(path, kafka, cfg) as sink:
        result = mongocdc.snapshot(cfg, namespace, sink, filter=filter_doc, metrics=metrics, progress=progress)
    removed = [] if filter_doc else remove_superseded(mongocdc, namespace, path)
    return _Landed(
        metadata={
            "dagster/row_count": result.documents,
            "bytes": result.bytes,
            "duration_s": round(result.duration_s, 3),
            "documents_per_s": round(result.documents / result.duration_s) if result.duration_s > 0 else None,
            **position_metadata("position", result.position),
            COVERS_FROM: result.position.to_str(),
            "resume_token": _token_json(result.resume_token),
            "superseded_snapshots_removed": MetadataValue.json(removed),
            **metrics_metadata(metrics, ("snapshot",)),
        },
        expectation=Expectation(namespace, snapshot=True, exact=result.position),
        position=result.position,
        documents_in_file=lambda: count_rows_at(path, result.position),
    )


def _land_incremental(mongocdc: MongoCdcResource, kafka: MongoCdcKafkaResource, cfg: ConnectorConfig, namespace: str,
                      path: Path, filter_doc: dict[str, Any] | None, metrics: ConnectorMetrics,
                      progress: LogProgress) -> _Landed:
    with landing_sink(path, kafka, cfg) as sink:
        # No state file: a retried run copies the collection again into a new file, so the landed file
        # is always one whole snapshot (resuming would land only the chunks after the failure).
        result = mongocdc.incremental_snapshot(cfg, namespace, sink, filter=filter_doc, metrics=metrics,
                                               progress=progress)
    end = result.end_position or Position.from_timestamp(mongocdc.cluster_time(cfg))
    return _Landed(
        metadata={
            "dagster/row_count": result.documents,
            "streamed_events": result.events,
            "duration_s": round(result.duration_s, 3),
            **position_metadata("first_position", result.first_position),
            **position_metadata("last_position", result.last_position),
            **position_metadata("position", end),
            # the file holds every change up to its end: later changes come from the slices
            COVERS_FROM: end.to_str(),
            **metrics_metadata(metrics, ("snapshot", "streaming")),
        },
        expectation=Expectation(namespace, snapshot=True, incremental=True),
        position=end,
        documents_in_file=lambda: live_keys(path),
    )


_COPY_KINDS: dict[CdcKind, _CopyKind] = {
    "snapshot": _CopyKind(
        "snapshot", "blocking snapshot", "Blocking snapshots of the selected collections, one after another.",
        "every record is a valid read event", "snapshot reads equal the source count at the snapshot position",
        MongoCdcResource.snapshot_path, _land_snapshot),
    "incremental_snapshot": _CopyKind(
        "incremental_snapshot", "incremental snapshot", "Incremental snapshots of the selected collections.",
        "every record is a valid read or streamed change",
        "the keys alive at the snapshot's end equal the source count there",
        MongoCdcResource.incremental_snapshot_path, _land_incremental),
}


def _copy_asset(copy: _CopyKind, specs: list[AssetSpec], ns_of: dict[AssetKey, str],
                totals: Mapping[str, int | None], names: ConnectorNames) -> AssetsDefinition:
    """One snapshot kind over every discovered collection: each selected collection copied in turn into
    its single landing file, with its materialisation and checks."""
    check_specs = [
        spec
        for s in specs
        for spec in (AssetCheckSpec(ENVELOPE_CHECK, asset=s.key, description=copy.envelope),
                     AssetCheckSpec(COUNT_CHECK, asset=s.key, description=copy.count))
    ]

    @multi_asset(name=names.of(copy.kind), specs=specs, check_specs=check_specs, can_subset=True,
                 pool=Pools.of(names).snapshots, required_resource_keys={names.mongocdc, names.kafka},
                 retry_policy=STEP_RETRY_POLICY,
                 description=copy.description)
    def copy_asset(context: AssetExecutionContext, config: SnapshotConfig) -> Iterator[MaterializeResult | AssetCheckResult]:
        with stop_when_terminated(context):
            mongocdc = resource_of(context, names.mongocdc, MongoCdcResource)
            kafka = resource_of(context, names.kafka, MongoCdcKafkaResource)
            cfg = mongocdc.load_config()
            checks = _selected_checks(context)
            for key, namespace, filter_text, filter_doc in _selected_copies(context, config, mongocdc, cfg, ns_of):
                path = copy.path(mongocdc, namespace, snapshot_file_name(filter_text))
                context.log.info(f"{copy.label} of {namespace} into {path}" + (f" with filter {filter_text}" if filter_doc else ""))
                metrics = ConnectorMetrics(cfg.topic_prefix, cfg.custom_metric_tags)
                landed = copy.land(mongocdc, kafka, cfg, namespace, path, filter_doc, metrics, LogProgress(context.log, totals))
                yield MaterializeResult(
                    asset_key=key,
                    metadata={
                        **_collection_meta(key, namespace),
                        "dagster/uri": MetadataValue.path(str(path)),
                        PARTIAL: filter_doc is not None,
                        "filter": filter_text,
                        "signal_id": config.signal_id,
                        **landed.metadata,
                    },
                )
                if AssetCheckKey(key, ENVELOPE_CHECK) in checks:
                    yield envelope_result(key, validate_file(path, landed.expectation))
                if AssetCheckKey(key, COUNT_CHECK) in checks:
                    yield source_count_result(key, mongocdc, cfg, namespace, landed.documents_in_file(), landed.position,
                                              filter_doc)

    return copy_asset


# -- ranges -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RangeKey:
    """``<plan>-<index>-of-<count>``: range ``index`` (0-based) of the plan's ``count``."""

    plan: str
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.plan}-{self.index:05d}-of-{self.count:05d}"

    @classmethod
    def parse(cls, text: str) -> "RangeKey":
        plan, index, _, count = text.rsplit("-", 3)
        return cls(plan, int(index), int(count))


def write_plan(mongocdc: MongoCdcResource, namespace: str, split_size: int) -> list[str]:
    """Plan the collection's ``_id`` ranges into ``ranges-<plan>/plan.json``; returns the plan's partition keys."""
    ranges = mongocdc.plan_ranges(namespace, split_size)
    body = [r.to_json() for r in ranges]
    plan = hashlib.sha1(orjson.dumps([namespace, body, time.time_ns()])).hexdigest()[:8]
    folder = mongocdc.ranges_dir(namespace, plan)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PLAN_FILE).write_bytes(orjson.dumps(
        {"namespace": namespace, "plan": plan, "split_size": split_size, "ranges": body,
         "planned_at": datetime.now(UTC).isoformat()}, option=orjson.OPT_INDENT_2))
    return [str(RangeKey(plan, i, len(ranges))) for i in range(len(ranges))]


def _plan_ranges(mongocdc: MongoCdcResource, namespace: str, key: RangeKey) -> list[IdRange]:
    path = mongocdc.ranges_dir(namespace, key.plan) / PLAN_FILE
    try:
        plan = orjson.loads(path.read_bytes())
    except OSError:
        raise Failure(f"range plan {key.plan} of {namespace} has no {path}; plan the ranges again "
                      "(job mongocdc_plan_snapshot_ranges)", allow_retries=False) from None
    return [IdRange.from_json(r) for r in plan["ranges"]]


def _range_done_files(folder: Path) -> dict[int, Position]:
    done: dict[int, Position] = {}
    for path in folder.glob("range-*.done.json"):
        data = orjson.loads(path.read_bytes())
        done[int(data["index"])] = Position.parse(data["position"])
    return done


def _ranged_snapshot_asset(spec: AssetSpec, namespace: str, state: DiscoveryState,
                           names: ConnectorNames) -> AssetsDefinition:
    partitions = ranges_partitions(namespace, names)
    total = next((c.estimated_documents for c in state.collections if c.namespace == namespace), None)
    key = spec.key

    @multi_asset(
        name=names.of(f"snapshot_ranges__{name_part(namespace)}"),
        specs=[spec.replace_attributes(partitions_def=partitions)],
        check_specs=[AssetCheckSpec(ENVELOPE_CHECK, asset=key, description="every record is a valid read event")],
        pool=Pools.of(names).snapshot_ranges,
        retry_policy=STEP_RETRY_POLICY,
        required_resource_keys={names.mongocdc, names.kafka},
        backfill_policy=BackfillPolicy.multi_run(1),
        description=f"Blocking snapshot of {namespace}, one `_id` range per partition (backfill all ranges).",
    )
    def ranged_snapshot(context: AssetExecutionContext, config: SnapshotConfig) -> Iterator[MaterializeResult | AssetCheckResult]:
        with stop_when_terminated(context):
            mongocdc = resource_of(context, names.mongocdc, MongoCdcResource)
            kafka = resource_of(context, names.kafka, MongoCdcKafkaResource)
            cfg = mongocdc.load_config()
            _require_captured(mongocdc, cfg, [namespace])
            range_key = RangeKey.parse(context.partition_key)
            id_range = _plan_ranges(mongocdc, namespace, range_key)[range_key.index]
            filter_text = config.filters.get(namespace)
            filter_doc = parse_filter(filter_text)
            path = mongocdc.range_path(namespace, range_key.plan, range_key.index, range_key.count)
            context.log.info(f"snapshot of {namespace}, range {range_key.index + 1} of {range_key.count} "
                             f"({id_range.describe()}) into {path}")
            per_range = None if total is None else max(1, total // range_key.count)
            metrics = ConnectorMetrics(cfg.topic_prefix, cfg.custom_metric_tags)
            with landing_sink(path, kafka, cfg) as sink:
                result = mongocdc.snapshot(cfg, namespace, sink, filter=filter_doc, id_range=id_range,
                                           metrics=metrics, progress=LogProgress(context.log, {namespace: per_range}))
            folder = path.parent
            (folder / f"{path.stem}.done.json").write_bytes(orjson.dumps(
                {"index": range_key.index, "position": result.position.to_str(), "documents": result.documents}))
            done = _range_done_files(folder)
            complete = len(done) == range_key.count
            covers = min(done.values()) if complete else None
            removed = remove_superseded(mongocdc, namespace, folder) if complete and not filter_doc else []
            context.log.info(f"{namespace}: {len(done)} of {range_key.count} ranges of plan {range_key.plan} done"
                             + (f"; the plan is complete and covers the collection from {position_time(covers)}"
                                if covers is not None else ""))
            yield MaterializeResult(
                asset_key=key,
                metadata={
                    **_collection_meta(key, namespace),
                    "plan": range_key.plan,
                    "range": f"{range_key.index + 1} of {range_key.count}: {id_range.describe()}",
                    "ranges_done": f"{len(done)} of {range_key.count}",
                    "ranges_done_count": len(done),
                    "ranges_total": range_key.count,
                    "dagster/row_count": result.documents,
                    "dagster/uri": MetadataValue.path(str(path)),
                    "duration_s": round(result.duration_s, 3),
                    **position_metadata("position", result.position),
                    # only the materialisation that completes the plan covers the collection
                    COVERS_FROM: covers.to_str() if covers is not None else None,
                    PARTIAL: covers is None or filter_doc is not None,
                    "superseded_snapshots_removed": MetadataValue.json(removed),
                    "signal_id": config.signal_id,
                    **metrics_metadata(metrics, ("snapshot",)),
                },
            )
            if AssetCheckKey(key, ENVELOPE_CHECK) in _selected_checks(context):
                yield envelope_result(key, validate_file(path, Expectation(namespace, snapshot=True, exact=result.position)))

    return ranged_snapshot


# -- slices -----------------------------------------------------------------------------------------------


def _slices_asset(specs: list[AssetSpec], ns_of: dict[AssetKey, str], cdc: CdcAssets,
                  windows: SliceWindows) -> AssetsDefinition:
    partitioned = [s.replace_attributes(partitions_def=windows.definition, skippable=True) for s in specs]
    check_specs = [AssetCheckSpec(ENVELOPE_CHECK, asset=s.key,
                                  description="every record is a valid change event inside its window")
                   for s in specs]

    @multi_asset(
        name=cdc.names.of("slices"),
        specs=partitioned,
        check_specs=check_specs,
        can_subset=True,
        pool=cdc.pools.slices,
        retry_policy=STEP_RETRY_POLICY,
        required_resource_keys={cdc.names.mongocdc, cdc.names.kafka},
        backfill_policy=BackfillPolicy.single_run(),
        description="Stream slices of the selected collections and windows, read from one change stream.",
    )
    def slices_asset(context: AssetExecutionContext) -> Iterator[MaterializeResult | AssetMaterialization | AssetCheckResult]:
        with stop_when_terminated(context):
            mongocdc = resource_of(context, cdc.names.mongocdc, MongoCdcResource)
            kafka = resource_of(context, cdc.names.kafka, MongoCdcKafkaResource)
            cfg = mongocdc.load_config()
            namespaces = _included(context, cfg, sorted(ns_of[k] for k in context.selected_asset_keys))
            selected = [cdc.key(ns, "slices") for ns in namespaces]
            ns_key = {ns_of[k]: k for k in selected}
            window_of = {k: windows.window(k) for k in context.partition_keys}
            window_keys = sorted(window_of, key=lambda k: window_of[k].start)
            oplog_first = mongocdc.oplog_window().first
            reads: dict[tuple[str, int], WindowRead] = {}
            # a collection's snapshots and landed windows matter only to a window whose start left the oplog: read
            # them for such runs alone, not in every run of every collection
            left = any(left_oplog(window_of[k], oplog_first) for k in window_keys)
            for namespace in namespaces:
                snaps: list[Position] = []
                landed: list[datetime] = []
                if left:
                    snaps = snapshot_positions(context.instance, cdc.snapshot_keys(namespace))
                    if not snaps:  # the collection's capture began with its first landed slice
                        landed = [windows.window(k).start
                                  for k in context.instance.get_materialized_partitions(ns_key[namespace])]
                for index, window_key in enumerate(window_keys):
                    window = window_of[window_key]
                    reads[(namespace, index)] = plan_window_read(
                        window_key, window, oplog_first, snaps, landed_before=any(t < window.start for t in landed))
            gaps = {k: r for k, r in reads.items() if r.gap is not None}
            todo = {k: r for k, r in reads.items() if r.gap is None}
            starts = [Position.from_timestamp(_ts(window_of[k].start)) for k in window_keys]
            targets = {
                (ns, i): RouteTarget(mongocdc.slice_path(ns, r.window.start), Position.from_timestamp(r.start))
                for (ns, i), r in todo.items()
            }
            started = time.monotonic()
            metrics = ConnectorMetrics(cfg.topic_prefix, cfg.custom_metric_tags)
            readable = [r for r in todo.values() if _key(r.start) < _key(r.end)]
            if readable:
                first = min((r.start for r in readable), key=_key)
                last = max((r.end for r in readable), key=_key)
                streamed = sorted({ns for (ns, _), r in todo.items() if r in readable})
                context.log.info(
                    f"stream of {', '.join(streamed)} over [{position_time(Position.from_timestamp(first))}, "
                    f"{position_time(Position.from_timestamp(last))}): {len(window_keys)} window(s), one change stream")
                router = WindowRouter(starts, targets)
                sink: Sink = TeeSink([router, kafka.open_sink(cfg)]) if kafka.enabled else router
                try:
                    mongocdc.stream_window(cfg, streamed, first, last, sink, metrics=metrics,
                                           progress=LogProgress(context.log))
                    sink.close()
                except HistoryLostError as exc:
                    router.abort()
                    raise Failure(description=f"history lost while reading {', '.join(streamed)}: {exc}",
                                  metadata={"remedy": "snapshot the collection again"}, allow_retries=False) from exc
                except BaseException:
                    router.abort()
                    raise
            else:
                WindowRouter(starts, targets).close()  # windows wholly covered by a snapshot: empty files
            duration = time.monotonic() - started
            now = datetime.now(UTC)
            checks = _selected_checks(context)
            single = len(window_keys) == 1
            debezium = metrics_metadata(metrics, ("streaming",))
            for key in selected:
                namespace = ns_of[key]
                reports: list[EnvelopeReport] = []
                for index in range(len(window_keys)):
                    if (namespace, index) not in todo:
                        continue
                    read, target = todo[(namespace, index)], targets[(namespace, index)]
                    metadata = {
                        **_collection_meta(key, namespace),
                        "window_start": MetadataValue.timestamp(read.window.start),
                        "window_end": MetadataValue.timestamp(read.window.end),
                        "read_from": read.read_from(),
                        **position_metadata("read_start", Position.from_timestamp(read.start)),
                        "dagster/row_count": target.events,
                        NEW_DATA: target.events > 0,  # an empty window asks for no table refresh
                        "dagster/uri": MetadataValue.path(str(target.path)),
                        **{f"op_{op}": count for op, count in sorted(target.counts.items())},
                        **position_metadata("first_position", target.first),
                        **position_metadata("last_position", target.last),
                        "lag_s": round((now - read.window.end).total_seconds(), 3),
                        "run_windows": len(window_keys),
                        "run_duration_s": round(duration, 3),
                        **debezium,
                    }
                    if single:
                        yield MaterializeResult(asset_key=key, metadata=metadata)
                    else:
                        yield AssetMaterialization(asset_key=key, partition=read.window_key, metadata=metadata)
                    reports.append(validate_file(target.path, Expectation(
                        namespace, snapshot=False, low=Position.from_timestamp(read.start),
                        high=Position.from_timestamp(read.end))))
                if reports and AssetCheckKey(key, ENVELOPE_CHECK) in checks:
                    yield envelope_result(key, EnvelopeReport(
                        sum(r.rows for r in reports), sum(r.reads for r in reports), sum(r.invalid for r in reports),
                        [p for r in reports for p in r.problems][:20]), f" in {len(reports)} window(s)")
            if gaps:
                lines = sorted(f"{ns} {r.window_key}: {r.gap}" for (ns, _), r in gaps.items())
                raise Failure(
                    description=f"{len(gaps)} window(s) cannot be read without a gap:\n" + "\n".join(lines[:20]),
                    metadata={"windows": MetadataValue.json(lines),
                              "remedy": "snapshot the collection again: its snapshot then covers the lost windows"},
                    allow_retries=False,
                )

    return slices_asset
