"""Schedules: the closed windows of every collection, and the cross-window checks on their own."""

from __future__ import annotations

from collections.abc import Iterator

from dagster import (
    AssetCheckKey,
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    RunsFilter,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    define_asset_job,
    schedule,
)
from dagster._core.storage.tags import SCHEDULE_NAME_TAG

from mongocdc_dagster.assets.cdc import CdcAssets
from mongocdc_dagster.gaps import GAP_CHECK, run_span, slice_request
from mongocdc_dagster.logs import RUN_CONFIG
from mongocdc_dagster.partitions import MAX_WINDOWS_PER_RUN, SliceWindows
from mongocdc_dagster.retries import ACTIVE, RUN_RETRY_TAGS, in_flight
from mongocdc_dagster.sensors import TAG_KIND

#: How many of the schedule's latest runs it looks at: its run in flight, and the furthest window landed.
_RECENT_RUNS = 20


def build_latest_window_schedule(cdc: CdcAssets) -> ScheduleDefinition:
    """At each window boundary, one run landing every collection's windows closed since the schedule's
    previous run (one change stream for all of them): the window that just closed when that run's
    windows had landed by then, all of them when the deployment is behind. While its previous run is
    queued or running it requests none (a second slice run would only queue behind it for the same pool),
    so a deployment that is behind catches up in fewer, larger runs instead of queueing one per window.
    A run that failed as a whole is retried by Dagster (``retries.RUN_RETRY_TAGS``; a failed step has its own
    ``RetryPolicy``); the schedule waits for its retry too."""
    namespace_of = cdc.keys_of("slices")
    slices = list(namespace_of)
    name = cdc.names.of("latest_window")

    @schedule(name=name, cron_schedule=cdc.windows.cron, execution_timezone="UTC",
              target=AssetSelection.assets(*slices), default_status=DefaultScheduleStatus.RUNNING,
              description="Lands every collection's slices of the windows closed since its previous run.")
    def latest_window(context: ScheduleEvaluationContext) -> Iterator[RunRequest | SkipReason]:
        latest = cdc.windows.latest_closed(context.scheduled_execution_time)
        if latest is None:
            yield SkipReason("no window has closed since the slice windows start")
            return
        recent = context.instance.get_runs(filters=RunsFilter(tags={SCHEDULE_NAME_TAG: name}), limit=_RECENT_RUNS)
        busy = next((run for run in recent if run.status in ACTIVE), None)
        if busy is None and recent and in_flight(recent[0]):  # its retry is the next run
            busy = recent[0]
        if busy is not None:
            state = "to be retried" if busy.status not in ACTIVE else busy.status.value.lower()
            span = run_span(busy, cdc.windows)
            yield SkipReason(f"its run {busy.run_id} (windows to {span[1] if span else '?'}) is still {state}: "
                             "the windows closed meanwhile land in one run on the first tick after it ends")
            return
        # the furthest window its runs reached, not the newest run's: a schedule run re-executed from the UI
        # carries its old windows, and going on after them would land every window since again
        ends = [span[1] for run in recent if (span := run_span(run, cdc.windows))]
        keys = [latest]
        if ends:
            landed_to = max(ends, key=lambda end: cdc.windows.window(end).end)
            after = cdc.windows.window(landed_to).end
            keys = cdc.windows.keys_between(after, cdc.windows.window(latest).end)[:MAX_WINDOWS_PER_RUN]
            if not keys:
                yield SkipReason(f"its previous run already landed the windows to {landed_to}")
                return
        # a dropped collection only while its windows began before the drop
        first = cdc.windows.window(keys[0]).start
        selection = [key for key in slices if (dropped := cdc.dropped.get(namespace_of[key])) is None or first < dropped]
        if not selection:
            yield SkipReason(f"every collection was dropped before the windows from {keys[0]}")
            return
        # the in-run envelope checks only: the continuity checks have a schedule of their own, and inside a
        # slice run they would count the windows closed since it was requested as gaps
        if len(keys) > 1:
            context.log.info(f"{len(keys)} windows closed since the previous run's: {keys[0]} to {keys[-1]} in one run")
        yield slice_request(keys[0] if len(keys) == 1 else f"{keys[0]}...{keys[-1]}", keys, selection,
                            {TAG_KIND: "slices", **RUN_RETRY_TAGS}, cdc.windows)

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
