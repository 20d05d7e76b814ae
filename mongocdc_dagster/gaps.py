"""Windows of a collection not landed behind its last landed one, and what becomes of them; the single home of
a slice run's window span and of the run requests landing a span of windows.

A slice run whose retries are used up leaves its windows behind: the schedule goes on after them. Those
the oplog still holds are requested again by the ``mongocdc_slice_gaps`` sensor (runs tagged
``mongocdc/reason: gap``), one contiguous hole per run (a window that failed before, alone), waiting
:data:`REPAIR_BACKOFF` (doubled each time) after a failed attempt, at most :data:`MAX_REPAIRS` times each.
No repair is requested while the oplog cannot be read (an outage would use the attempts up). One the oplog
no longer holds (and no snapshot covers), or whose repairs failed that many times, cannot be landed: the
``no_gap_since_snapshot`` check fails with ERROR severity, naming the windows, why, and the remedy (a new
snapshot of the collection, which then covers them). A dropped collection (or one the filters now leave
out) has nothing more requested and its check passes. Shared by that sensor and that check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bson import Timestamp
from dagster import (
    AssetCheckEvaluation,
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    MetadataValue,
    RunRequest,
    RunsFilter,
)
from dagster._core.definitions.metadata import RawMetadataValue
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)
from pymongo.errors import PyMongoError

from mongocdc_core.source.errors import CdcError
from mongocdc_dagster.assets.cdc import ENVELOPE_CHECK, CdcAssets, plan_window_read
from mongocdc_dagster.landed_history import CollectionHistory, missing_windows
from mongocdc_dagster.logs import RUN_CONFIG
from mongocdc_dagster.metadata import position_time
from mongocdc_dagster.partitions import MAX_WINDOWS_PER_RUN, SliceWindows
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.retries import slice_max_runtime

GAP_CHECK = "no_gap_since_snapshot"
#: Runs that land missing windows again carry this tag (``mongocdc/reason``), with the value :data:`GAP`.
TAG_REASON = "mongocdc/reason"
GAP = "gap"
#: How many failed runs of a window requested again make it given up.
MAX_REPAIRS = 3
#: The pause after a window's first failed repair before the next (doubled after each): its attempts are
#: spread over 15 minutes at least, longer than a replica set's election or a broker's restart.
REPAIR_BACKOFF = timedelta(minutes=5)
#: The failed repair runs read to count the attempts (newest first).
_FAILED_RUNS_READ = 500
REMEDY = ("snapshot the collection again (an execute-snapshot signal, type incremental, in the signaling "
          "collection, or its snapshot asset): the snapshot then covers the windows that cannot be landed")


def run_span(run: DagsterRun, windows: SliceWindows) -> tuple[str, str] | None:
    """The first and last window a slice run lands (its partition, or its range); None for a run of no
    window of ``windows`` (a run from before the window size changed)."""
    first = run.tags.get(ASSET_PARTITION_RANGE_START_TAG) or run.tags.get(PARTITION_NAME_TAG)
    last = run.tags.get(ASSET_PARTITION_RANGE_END_TAG) or run.tags.get(PARTITION_NAME_TAG)
    if first is None or last is None:
        return None
    has = windows.definition.has_partition_key
    return (first, last) if has(first) and has(last) else None


def slice_request(run_key: str, keys: Sequence[str], selection: Sequence[AssetKey], tags: dict[str, str],
                  windows: SliceWindows) -> RunRequest:
    """The run landing ``keys`` (consecutive windows) of ``selection``'s slices with their envelope checks:
    one partition, or a range in one run, with its maximum run time (``retries.slice_max_runtime``). The
    selection is named on the request so the run records it (the Runs page's Target column shows a run of
    an implicit asset job by its asset selection)."""
    checks = [AssetCheckKey(key, ENVELOPE_CHECK) for key in selection]
    tags = {**tags, **slice_max_runtime(len(keys) * windows.seconds)}
    if len(keys) == 1:
        return RunRequest(run_key=run_key, partition_key=keys[0], asset_selection=list(selection),
                          asset_check_keys=checks, tags=tags, run_config=RUN_CONFIG)
    return RunRequest(run_key=run_key, asset_selection=list(selection), asset_check_keys=checks,
                      run_config=RUN_CONFIG,
                      tags={**tags, ASSET_PARTITION_RANGE_START_TAG: keys[0], ASSET_PARTITION_RANGE_END_TAG: keys[-1]})


def readable_oplog_start(mongocdc: MongoCdcResource) -> Timestamp | None:
    """Where the oplog starts, read as a slice run reads it (every shard's must be readable); None when it
    cannot be read."""
    try:
        return mongocdc.oplog_window().first
    except (CdcError, PyMongoError):
        return None


@dataclass(frozen=True)
class Attempt:
    """A failed repair run (with Dagster's retries of it: one attempt): its windows' span, the slices it
    selected (None: all), when it ended."""

    first: datetime
    last: datetime
    selection: frozenset[AssetKey] | None
    ended: datetime


def failed_repairs(instance: DagsterInstance, windows: SliceWindows) -> list[Attempt]:
    """The failed runs that were to land missing windows again, one per first run (its retries copy its
    tags), newest end first."""
    records = instance.get_run_records(
        filters=RunsFilter(tags={TAG_REASON: GAP}, statuses=[DagsterRunStatus.FAILURE]), limit=_FAILED_RUNS_READ)
    attempts: dict[str, Attempt] = {}
    for record in records:
        run = record.dagster_run
        span = run_span(run, windows)
        if span is None:
            continue
        ended = (datetime.fromtimestamp(record.end_time, UTC) if record.end_time is not None
                 else record.update_timestamp.astimezone(UTC))
        root = run.root_run_id or run.run_id
        if root not in attempts or attempts[root].ended < ended:
            attempts[root] = Attempt(windows.window(span[0]).start, windows.window(span[1]).start,
                                     None if run.asset_selection is None else frozenset(run.asset_selection), ended)
    return sorted(attempts.values(), key=lambda a: a.ended, reverse=True)


def _attempts_at(attempts: Sequence[Attempt], key: AssetKey, start: datetime) -> list[Attempt]:
    return [a for a in attempts if a.first <= start <= a.last and (a.selection is None or key in a.selection)]


@dataclass(frozen=True)
class Holes:
    """One collection's closed windows not landed: ``behind`` its last landed window (left by a failed run),
    of which ``landable`` can still be landed (``due``: those to request now, the others wait for their
    back-off; ``retried``: those that failed before) and ``lost`` cannot (window -> why); ``pending``: closed
    windows after its last landed one, the schedule's next run's."""

    namespace: str
    behind: tuple[str, ...] = ()
    landable: tuple[str, ...] = ()
    lost: dict[str, str] = field(default_factory=dict)
    pending: tuple[str, ...] = ()
    due: tuple[str, ...] = ()
    retried: frozenset[str] = frozenset()


def find_holes(history: CollectionHistory, windows: SliceWindows, key: AssetKey, now: datetime,
               oplog_first: Timestamp | None, failed: Sequence[Attempt]) -> Holes:
    """Which of the collection's missing windows can still be landed (``oplog_first`` None: the oplog could not
    be read, so only the attempts decide)."""
    missing = missing_windows(history, windows, now)
    if not missing or not history.window_keys:
        return Holes(history.namespace, pending=tuple(missing))
    last = windows.window(history.window_keys[-1]).start
    behind = [k for k in missing if windows.window(k).start < last]
    landable: list[str] = []
    due: list[str] = []
    retried: set[str] = set()
    lost: dict[str, str] = {}
    for window_key in behind:
        if oplog_first is not None:
            # the newest snapshot alone decides whether the window is lost: an older one the oplog holds is older
            # than it, so the oplog holds the newest too
            snapshots = [history.snapshot] if history.snapshot is not None else []
            read = plan_window_read(window_key, windows.window(window_key), oplog_first, snapshots, landed_before=True)
            if read.gap is not None:
                lost[window_key] = read.gap
                continue
        tried = _attempts_at(failed, key, windows.window(window_key).start)
        if len(tried) >= MAX_REPAIRS:
            lost[window_key] = (f"given up: {len(tried)} runs requested to land it again failed (runs tagged "
                                f"{TAG_REASON}={GAP}; see their errors)")
            continue
        landable.append(window_key)
        if tried:
            retried.add(window_key)
        if not tried or now >= tried[0].ended + REPAIR_BACKOFF * 2 ** (len(tried) - 1):
            due.append(window_key)
    return Holes(history.namespace, tuple(behind), tuple(landable), lost,
                 tuple(k for k in missing if windows.window(k).start >= last), tuple(due), frozenset(retried))


def judge(cdc: CdcAssets, history: CollectionHistory, now: datetime, oplog_first: Timestamp | None,
          failed: Sequence[Attempt]) -> GapVerdict:
    """``no_gap_since_snapshot`` of one collection now, from its landed history (``CdcAssets.histories``, read
    for all the collections judged at once); a dropped one passes, with nothing more to land."""
    namespace = history.namespace
    if namespace in cdc.dropped:
        return GapVerdict(Holes(namespace), since_text(history), len(history.window_keys), cdc.dropped[namespace])
    holes = find_holes(history, cdc.windows, cdc.key(namespace, "slices"), now, oplog_first, failed)
    return GapVerdict(holes, since_text(history), len(history.window_keys))


def repair_request(due: dict[str, Holes], cdc: CdcAssets, previous: str | None, tags: dict[str, str]) -> RunRequest:
    """One run landing the oldest hole of the windows due again: a window that failed before alone (so an
    always-failing window does not sink its neighbours), else the contiguous windows from the oldest on, of
    every collection missing one of them. Its run key names the windows, the collections and the newest
    repair run before it (``previous``, whatever its status), so a request is new once that run ended. No run
    retries (``tags`` has none): the sensor is the retrier, and counts a failed run once."""
    windows = cdc.windows
    wanted = sorted({k for holes in due.values() for k in holes.due}, key=lambda k: windows.window(k).start)
    retried = {k for holes in due.values() for k in holes.retried}
    keys = [wanted[0]]
    if wanted[0] not in retried:
        for window_key in wanted[1:]:
            if (window_key in retried or len(keys) >= MAX_WINDOWS_PER_RUN
                    or windows.window(window_key).start != windows.window(keys[-1]).end):
                break
            keys.append(window_key)
    span = set(keys)
    selection = [cdc.key(ns, "slices") for ns, holes in sorted(due.items()) if span & set(holes.due)]
    digest = hashlib.sha1(",".join(k.to_user_string() for k in selection).encode()).hexdigest()[:10]
    return slice_request(f"{GAP}:{keys[0]}...{keys[-1]}:{digest}:{previous or 'first'}", keys, selection,
                         {**tags, TAG_REASON: GAP}, windows)


@dataclass(frozen=True)
class GapVerdict:
    """``no_gap_since_snapshot`` of one collection: ERROR when a window cannot be landed any more, WARN while
    windows behind the last landed one are requested again; passes otherwise, also with ``pending`` windows
    (closed since the last landed one: the schedule's next run lands them; the freshness policy tells when it
    does not), and for a ``dropped`` collection."""

    holes: Holes
    since: str
    landed: int
    dropped: datetime | None = None

    @property
    def passed(self) -> bool:
        return not self.holes.behind

    @property
    def severity(self) -> AssetCheckSeverity:
        return AssetCheckSeverity.ERROR if self.holes.lost else AssetCheckSeverity.WARN

    @property
    def description(self) -> str:
        ns, holes = self.holes.namespace, self.holes
        if self.dropped is not None:
            return (f"{ns}: dropped (no longer captured since {self.dropped.isoformat(timespec='seconds')}); no "
                    "window of it is landed any more")
        if self.passed:
            pending = (f"; {len(holes.pending)} closed since the last landed one are the schedule's next run's"
                       if holes.pending else "")
            return f"{ns}: every closed window since {self.since} is landed{pending}"
        behind = sorted(holes.behind)
        text = f"{ns}: {len(behind)} closed window(s) since {self.since} not landed: {_shown(behind)}"
        if holes.lost:
            lost = sorted(holes.lost)
            text += (f"; {len(lost)} cannot be landed any more ({lost[0]}: {holes.lost[lost[0]]}"
                     + (f"; and {len(lost) - 1} more, see lost_windows" if len(lost) > 1 else "") + f"); {REMEDY}")
        if holes.landable:
            text += f"; {len(holes.landable)} behind the last landed window are requested again"
        return text

    @property
    def metadata(self) -> dict[str, RawMetadataValue]:
        holes = self.holes
        missing = sorted((*holes.behind, *holes.pending))
        return {"collection": holes.namespace, "snapshot": self.since, "windows_landed": self.landed,
                "verdict": "dropped" if self.dropped is not None else "lost" if holes.lost
                else "behind" if holes.behind else "landed",
                "missing_windows": MetadataValue.json(missing[:200]), "missing_count": len(missing),
                "pending_count": len(holes.pending),
                "lost_windows": MetadataValue.json(dict(sorted(holes.lost.items())[:200])),
                "lost_count": len(holes.lost), "requested_again": MetadataValue.json(list(holes.landable[:200])),
                "remedy": REMEDY if holes.lost else None}

    def result(self, key: AssetKey) -> AssetCheckResult:
        return AssetCheckResult(asset_key=key, check_name=GAP_CHECK, passed=self.passed, severity=self.severity,
                                description=self.description, metadata=self.metadata)

    def evaluation(self, key: AssetKey) -> AssetCheckEvaluation:
        """The same verdict reported from a sensor (no run)."""
        return AssetCheckEvaluation(asset_key=key, check_name=GAP_CHECK, passed=self.passed, severity=self.severity,
                                    description=self.description, metadata=self.metadata)


def since_text(history: CollectionHistory) -> str:
    return (position_time(history.snapshot) or "its snapshot") if history.snapshot else "its first landed window"


def _shown(keys: Sequence[str]) -> str:
    return ", ".join(keys[:10]) + (" ..." if len(keys) > 10 else "")
