"""Asset checks over the landed history: continuity of slices and freshness of the latest slice.

The per-file checks (envelope validity, snapshot count) run inside the materialising run, see
assets/cdc.py; these two look across partitions, so they read the instance.
"""

from datetime import UTC, datetime, timedelta
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    MetadataValue,
    asset_check,
)

from mongocdc_dagster.assets.cdc import CdcAssets
from mongocdc_dagster.history import collection_histories, missing_windows
from mongocdc_dagster.partitions import CdcPartitions

FRESHNESS_WINDOWS = 2  # a collection is stale when its latest slice ended more than 2 windows ago


def _md_list(items: dict[str, Any]) -> MetadataValue:
    return MetadataValue.md("\n".join(f"- `{k}`: {v}" for k, v in items.items()) or "none")


def build_checks(assets: CdcAssets, partitions: CdcPartitions) -> list[AssetChecksDefinition]:
    @asset_check(asset=assets.stream_slice_key, name="no_gap_since_snapshot",
                 description="Every window between a collection's last full snapshot and its latest slice is landed.")
    def no_gap(context: AssetCheckExecutionContext) -> AssetCheckResult:
        histories = collection_histories(context.instance, partitions, assets.snapshot_keys, assets.stream_slice_key)
        gaps = {ns: missing_windows(h, partitions) for ns, h in histories.items()}
        gaps = {ns: keys for ns, keys in gaps.items() if keys}
        return AssetCheckResult(
            passed=not gaps,
            metadata={"collections": len(histories), "collections_with_gaps": len(gaps),
                      "missing_windows": _md_list({ns: ", ".join(keys[:10]) + (" ..." if len(keys) > 10 else "")
                                                   for ns, keys in gaps.items()})},
        )

    @asset_check(asset=assets.stream_slice_key, name="latest_slice_fresh",
                 description=f"Each collection's latest slice ended at most {FRESHNESS_WINDOWS} windows ago.")
    def fresh(context: AssetCheckExecutionContext) -> AssetCheckResult:
        now = datetime.now(UTC)
        limit = timedelta(seconds=partitions.seconds * FRESHNESS_WINDOWS)
        histories = collection_histories(context.instance, partitions, assets.snapshot_keys, assets.stream_slice_key)
        lags: dict[str, str] = {}
        stale: dict[str, str] = {}
        for ns, history in histories.items():
            if not history.window_keys:
                stale[ns] = "no slice landed"
                continue
            lag = now - partitions.window(history.window_keys[-1]).end
            lags[ns] = f"{lag.total_seconds():.0f} s"
            if lag > limit:
                stale[ns] = f"{lag.total_seconds():.0f} s behind"
        return AssetCheckResult(
            passed=not stale,
            severity=AssetCheckSeverity.WARN,
            metadata={"limit_s": limit.total_seconds(), "lag": _md_list(lags), "stale": _md_list(stale)},
        )

    return [no_gap, fresh]
