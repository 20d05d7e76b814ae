"""Schedules: the latest closed window of every collection, and the cross-window checks on their own."""

from __future__ import annotations

from collections.abc import Iterator

from dagster import (
    AssetCheckKey,
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    schedule,
)

from mongocdc_dagster.assets.cdc import CdcAssets
from mongocdc_dagster.checks import GAP_CHECK
from mongocdc_dagster.sensors import TAG_KIND


def build_latest_window_schedule(cdc: CdcAssets) -> ScheduleDefinition:
    """At each window boundary, one run landing the window that just closed for every collection (one
    change stream for all of them)."""
    slices = list(cdc.keys_of("slices"))

    @schedule(name=cdc.names.of("latest_window"), cron_schedule=cdc.windows.cron, execution_timezone="UTC",
              target=AssetSelection.assets(*slices), default_status=DefaultScheduleStatus.RUNNING,
              description="Lands the latest closed window of every collection's slices.")
    def latest_window(context: ScheduleEvaluationContext) -> Iterator[RunRequest | SkipReason]:
        window_key = cdc.windows.latest_closed(context.scheduled_execution_time)
        if window_key is None:
            yield SkipReason("no window has closed since the slice windows start")
            return
        # The selection is named on the request so the run records it (the Runs page's Target column shows a
        # run of the schedule's implicit asset job by its asset selection, and shows nothing without one).
        yield RunRequest(run_key=window_key, partition_key=window_key, asset_selection=slices, tags={TAG_KIND: "slices"})

    return latest_window


def build_continuity_schedule(cdc: CdcAssets) -> ScheduleDefinition:
    """The no-gap checks of every collection, once per window, in runs of their own (never inside a slice run)."""
    job = define_asset_job(
        cdc.names.of("continuity_checks"),
        selection=AssetSelection.checks(*[AssetCheckKey(key, GAP_CHECK) for key in cdc.keys_of("slices")]),
        description="Checks that every closed window since each collection's snapshot is landed.",
    )
    return ScheduleDefinition(name=cdc.names.of("continuity"), job=job, cron_schedule=cdc.windows.cron,
                              execution_timezone="UTC", default_status=DefaultScheduleStatus.RUNNING,
                              description="Runs the cross-window continuity checks once per window.")
