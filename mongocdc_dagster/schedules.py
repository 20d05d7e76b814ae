"""The schedule that lands the latest closed window of every collection."""

from collections.abc import Iterator

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    schedule,
)

from mongocdc_dagster.assets.cdc import CdcAssets
from mongocdc_dagster.history import known_collections
from mongocdc_dagster.partitions import CdcPartitions
from mongocdc_dagster.sensors import TAG_COLLECTION, TAG_KIND


def build_latest_window_schedule(assets: CdcAssets, partitions: CdcPartitions, cron: str) -> ScheduleDefinition:
    """At each window boundary, one run per collection for the window that just closed."""

    @schedule(name="mongocdc_latest_window", cron_schedule=cron, execution_timezone="UTC",
              target=AssetSelection.assets(assets.stream_slice_key),
              default_status=DefaultScheduleStatus.RUNNING,
              description="Materialises the latest closed stream slice window of every collection.")
    def latest_window(context: ScheduleEvaluationContext) -> Iterator[RunRequest | SkipReason]:
        window_key = partitions.latest_closed_window(context.scheduled_execution_time)
        if window_key is None:
            yield SkipReason("no window has closed since the slice partitions start")
            return
        collections = known_collections(context.instance)
        if not collections:
            yield SkipReason("no collections discovered yet")
            return
        for namespace in collections:
            key = partitions.slice_key(namespace, window_key)
            yield RunRequest(run_key=str(key), partition_key=key,
                             tags={TAG_KIND: "stream_slice", TAG_COLLECTION: namespace})

    return latest_window
