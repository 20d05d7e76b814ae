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
from mongocdc_dagster.logs import RUN_CONFIG
from mongocdc_dagster.partitions import SliceWindows
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
        yield RunRequest(run_key=window_key, partition_key=window_key, asset_selection=slices, tags={TAG_KIND: "slices"},
                         run_config=RUN_CONFIG)

    return latest_window


#: How often the continuity checks run at most: once per window would double the runs of a deployment with
#: minute windows (a run of checks beside every slice run), and a window that fails to land fails its own
#: slice run first; the checks find the windows no run was ever requested for.
CONTINUITY_EVERY_S = 3600
HOURLY = "0 * * * *"


def continuity_cron(windows: SliceWindows) -> str:
    """Once per window for windows of an hour or longer, else once an hour."""
    return windows.cron if windows.seconds >= CONTINUITY_EVERY_S else HOURLY


def build_continuity_schedule(cdc: CdcAssets) -> ScheduleDefinition:
    """The no-gap checks of every collection, once per window of an hour or more (else hourly), in runs of
    their own (never inside a slice run)."""
    job = define_asset_job(
        cdc.names.of("continuity_checks"),
        selection=AssetSelection.checks(*[AssetCheckKey(key, GAP_CHECK) for key in cdc.keys_of("slices")]),
        description="Checks that every closed window since each collection's snapshot is landed.",
    )
    return ScheduleDefinition(name=cdc.names.of("continuity"), job=job, cron_schedule=continuity_cron(cdc.windows),
                              run_config=RUN_CONFIG,
                              execution_timezone="UTC", default_status=DefaultScheduleStatus.RUNNING,
                              description="Runs the cross-window continuity checks once per window, or hourly for shorter windows.")
