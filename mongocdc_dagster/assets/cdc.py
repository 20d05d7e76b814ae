"""The CDC assets: `snapshot`, `incremental_snapshot` (per collection), `stream_slice` (collection x window).

Each materialisation writes exactly one Parquet file for its partition through
``ParquetSink.to_file`` (temp file + rename at close), so re-running a partition replaces its file and
a failed run leaves the previous one in place. Like dagster-sling's assets, each run yields a
``MaterializeResult`` with metadata and the in-run asset check results for the file it wrote.

No ``from __future__ import annotations`` here: Dagster reads the annotations (Config, resources) at
definition time and cannot resolve them from strings.
"""

import hashlib
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from bson import Timestamp, json_util
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)
from pydantic import Field

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.base import Sink
from mongocdc_core.sinks.parquet import ParquetSink
from mongocdc_core.sinks.tee import TeeSink
from mongocdc_dagster.landing import EnvelopeReport, Expectation, count_rows_at, live_keys, validate_file
from mongocdc_dagster.partitions import CdcPartitions
from mongocdc_dagster.progress import RunLogProgress
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource
from mongocdc_dagster.translator import CdcAssetProps, MongoCdcTranslator

ENVELOPE_CHECK = "landing_envelopes"
COUNT_CHECK = "source_count"


class SnapshotConfig(Config):  # type: ignore[misc]
    """Run config a signal-triggered snapshot carries (empty for a plain partition run)."""

    filter: str | None = Field(
        default=None, description="MongoDB query (extended JSON) selecting the documents to copy"
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
def _landing_sink(path: Path, kafka: MongoCdcKafkaResource, cfg: ConnectorConfig) -> Iterator[Sink]:
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


def _require_captured(mongocdc: MongoCdcResource, cfg: ConnectorConfig, namespace: str) -> None:
    captured = mongocdc.captured_collections(cfg)
    if namespace not in captured:
        raise Failure(
            f"collection {namespace!r} is not captured by {mongocdc.config_path} "
            f"(captured: {', '.join(captured) or 'none'}); check the include/exclude lists",
            allow_retries=False,
        )


def _token_json(token: Mapping[str, Any] | None) -> str | None:
    return None if token is None else json_util.dumps(token)


def _envelope_result(key: AssetKey, report: EnvelopeReport) -> AssetCheckResult:
    return AssetCheckResult(
        asset_key=key,
        check_name=ENVELOPE_CHECK,
        passed=report.passed,
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
    metadata: dict[str, Any] = {"documents_in_file": in_file, "source_count_now": now, "position": str(position)}
    if in_file == now:
        return AssetCheckResult(asset_key=key, check_name=COUNT_CHECK, passed=True, metadata=metadata)
    counter = _CountingSink()
    now_ts = api.current_cluster_time(cfg)
    # the window is half-open: end one increment past now so a write at exactly `now` is counted
    api.stream_window(cfg, namespace, position.timestamp, Timestamp(now_ts.time, now_ts.inc + 1), counter)
    inserts, deletes = counter.counts.get("c", 0), counter.counts.get("d", 0)
    expected = now - inserts + deletes
    metadata.update({"inserts_since": inserts, "deletes_since": deletes, "expected_at_position": expected})
    passed = expected == in_file
    metadata["explanation"] = (
        f"{now} documents now; {inserts} inserted and {deletes} deleted since the snapshot position, "
        f"so {expected} existed at it; the snapshot holds {in_file}"
        + ("" if filter_doc is None else " (filtered: updates may move documents across the filter)")
    )
    return AssetCheckResult(
        asset_key=key, check_name=COUNT_CHECK, passed=passed, metadata=metadata,
        severity=AssetCheckSeverity.WARN if filter_doc is not None else AssetCheckSeverity.ERROR,
    )


@dataclass(frozen=True)
class CdcAssets:
    """The CDC asset definitions and the keys sensors, schedules and checks target."""

    snapshot: AssetsDefinition
    incremental_snapshot: AssetsDefinition
    stream_slice: AssetsDefinition
    snapshot_key: AssetKey
    incremental_snapshot_key: AssetKey
    stream_slice_key: AssetKey

    @property
    def snapshot_keys(self) -> list[AssetKey]:
        """Both snapshot kinds: either one resets a collection's baseline."""
        return [self.snapshot_key, self.incremental_snapshot_key]

    @property
    def assets(self) -> list[AssetsDefinition]:
        return [self.snapshot, self.incremental_snapshot, self.stream_slice]


def build_cdc_assets(
    cfg: ConnectorConfig, landing_dir: Path, partitions: CdcPartitions,
    translator: MongoCdcTranslator | None = None,
) -> CdcAssets:
    """Build the assets for one connector; `translator` controls keys, groups, tags and metadata."""
    translator = translator or MongoCdcTranslator()
    snap_props = CdcAssetProps.from_config("snapshot", cfg, str(landing_dir))
    inc_props = CdcAssetProps.from_config("incremental_snapshot", cfg, str(landing_dir))
    slice_props = CdcAssetProps.from_config("stream_slice", cfg, str(landing_dir))
    snap_spec = translator.get_asset_spec(snap_props)
    inc_spec = translator.get_asset_spec(inc_props)
    slice_spec = translator.get_asset_spec(slice_props)
    snap_key, inc_key, slice_key = snap_spec.key, inc_spec.key, slice_spec.key

    @multi_asset(
        name="_".join(snap_key.path),
        specs=[snap_spec],
        partitions_def=partitions.collections,
        check_specs=[
            AssetCheckSpec(ENVELOPE_CHECK, asset=snap_key, description="every record is a valid read event"),
            AssetCheckSpec(COUNT_CHECK, asset=snap_key,
                           description="snapshot reads equal the source count at the snapshot position"),
        ],
    )
    def snapshot_asset(
        context: AssetExecutionContext, config: SnapshotConfig, mongocdc: MongoCdcResource,
        kafka: MongoCdcKafkaResource,
    ) -> Iterator[MaterializeResult | AssetCheckResult]:
        namespace = context.partition_key
        cfg_now = mongocdc.load_config()
        _require_captured(mongocdc, cfg_now, namespace)
        filter_doc = parse_filter(config.filter)
        path = mongocdc.snapshot_path(namespace, snapshot_file_name(config.filter))
        context.log.info(f"blocking snapshot of {namespace} into {path}" + (f" with filter {config.filter}" if filter_doc else ""))
        with _landing_sink(path, kafka, cfg_now) as sink:
            result = api.snapshot_collection(
                cfg_now, namespace, sink, filter=filter_doc, progress=RunLogProgress(context.log)
            )
        yield MaterializeResult(
            asset_key=snap_key,
            metadata={
                **translator.get_collection_metadata(snap_props, namespace),
                "documents": result.documents,
                "bytes": result.bytes,
                "duration_s": round(result.duration_s, 3),
                "position": str(result.position),
                "resume_token": _token_json(result.resume_token),
                "path": MetadataValue.path(str(path)),
                "filter": config.filter,
                "signal_id": config.signal_id,
            },
        )
        report = validate_file(path, Expectation(namespace, snapshot=True, exact=result.position))
        yield _envelope_result(snap_key, report)
        yield source_count_result(snap_key, mongocdc, cfg_now, namespace, count_rows_at(path, result.position),
                                  result.position, filter_doc)

    @multi_asset(
        name="_".join(inc_key.path),
        specs=[inc_spec],
        partitions_def=partitions.collections,
        check_specs=[
            AssetCheckSpec(ENVELOPE_CHECK, asset=inc_key,
                           description="every record is a valid read or streamed change event"),
            AssetCheckSpec(COUNT_CHECK, asset=inc_key,
                           description="the keys alive at the snapshot's end equal the source count there"),
        ],
    )
    def incremental_snapshot_asset(
        context: AssetExecutionContext, config: SnapshotConfig, mongocdc: MongoCdcResource,
        kafka: MongoCdcKafkaResource,
    ) -> Iterator[MaterializeResult | AssetCheckResult]:
        namespace = context.partition_key
        cfg_now = mongocdc.load_config()
        _require_captured(mongocdc, cfg_now, namespace)
        filter_doc = parse_filter(config.filter)
        path = mongocdc.incremental_snapshot_path(namespace, snapshot_file_name(config.filter))
        context.log.info(f"incremental snapshot of {namespace} into {path}" + (f" with filter {config.filter}" if filter_doc else ""))
        with _landing_sink(path, kafka, cfg_now) as sink:
            # No state file: a retried run copies the collection again into a new file, so the landed file is
            # always one whole snapshot (resuming would land only the chunks after the failure).
            result = api.incremental_snapshot_collection(
                cfg_now, namespace, sink, filter=filter_doc, progress=RunLogProgress(context.log)
            )
        end = result.end_position or Position.from_timestamp(api.current_cluster_time(cfg_now))
        yield MaterializeResult(
            asset_key=inc_key,
            metadata={
                **translator.get_collection_metadata(inc_props, namespace),
                "documents": result.documents,
                "streamed_events": result.events,
                "duration_s": round(result.duration_s, 3),
                "first_position": str(result.first_position) if result.first_position else None,
                "last_position": str(result.last_position) if result.last_position else None,
                "position": str(end),
                "path": MetadataValue.path(str(path)),
                "filter": config.filter,
                "signal_id": config.signal_id,
            },
        )
        report = validate_file(path, Expectation(namespace, snapshot=True, incremental=True))
        yield _envelope_result(inc_key, report)
        yield source_count_result(inc_key, mongocdc, cfg_now, namespace, live_keys(path), end, filter_doc)

    @multi_asset(
        name="_".join(slice_key.path),
        specs=[slice_spec],
        partitions_def=partitions.slices,
        check_specs=[
            AssetCheckSpec(ENVELOPE_CHECK, asset=slice_key,
                           description="every record is a valid change event inside the window"),
        ],
    )
    def stream_slice_asset(
        context: AssetExecutionContext, mongocdc: MongoCdcResource, kafka: MongoCdcKafkaResource,
    ) -> Iterator[MaterializeResult | AssetCheckResult]:
        namespace, window_key = partitions.split_slice_key(context.partition_key)
        window = partitions.window(window_key)
        cfg_now = mongocdc.load_config()
        _require_captured(mongocdc, cfg_now, namespace)
        start = Timestamp(int(window.start.timestamp()), 0)
        end = Timestamp(int(window.end.timestamp()), 0)
        path = mongocdc.slice_path(namespace, window.start)
        context.log.info(f"stream slice of {namespace} over [{window.start.isoformat()}, {window.end.isoformat()}) into {path}")
        started = time.monotonic()
        with _landing_sink(path, kafka, cfg_now) as sink:
            try:
                result = api.stream_window(cfg_now, namespace, start, end, sink, progress=RunLogProgress(context.log))
            except api.HistoryLostError as exc:
                raise Failure(
                    description=f"history lost for {namespace} window {window_key}: {exc}",
                    metadata={"collection": namespace, "window": window_key,
                              "remedy": "snapshot the collection again (the oplog no longer holds this window)"},
                    allow_retries=False,
                ) from exc
        lag = (datetime.now(UTC) - window.end).total_seconds()
        yield MaterializeResult(
            asset_key=slice_key,
            metadata={
                **translator.get_collection_metadata(slice_props, namespace),
                "window_start": MetadataValue.timestamp(window.start),
                "window_end": MetadataValue.timestamp(window.end),
                "events": result.events,
                **{f"op_{op}": count for op, count in sorted(result.counts.items())},
                "first_position": str(result.first_position) if result.first_position else None,
                "last_position": str(result.last_position) if result.last_position else None,
                "resume_token": _token_json(result.resume_token),
                "lag_s": round(lag, 3),
                "duration_s": round(time.monotonic() - started, 3),
                "path": MetadataValue.path(str(path)),
                "counts": MetadataValue.json(orjson.loads(orjson.dumps(result.counts))),
            },
        )
        report = validate_file(
            path, Expectation(namespace, snapshot=False, low=Position(start.time, 0), high=Position(end.time, 0))
        )
        yield _envelope_result(slice_key, report)

    return CdcAssets(snapshot_asset, incremental_snapshot_asset, stream_slice_asset, snap_key, inc_key, slice_key)
