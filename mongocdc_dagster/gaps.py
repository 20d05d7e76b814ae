"""Windows of a collection not landed behind its last landed one, and what becomes of them.

A slice run whose retries are used up leaves its windows behind: the schedule goes on after them. Those
the oplog still holds are requested again by the oplog-window sensor (runs tagged ``mongocdc/reason: gap``),
at most :data:`MAX_REPAIRS` times each, so a window that keeps failing does not run on every tick. One the
oplog no longer holds (and no snapshot covers), or that failed that many times, cannot be landed: the
``no_gap_since_snapshot`` check fails with ERROR severity, naming the windows, why, and the remedy (a new
snapshot of the collection, which then covers them). Shared by that sensor and that check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bson import Timestamp
from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    DagsterInstance,
    DagsterRun,
    DagsterRunStatus,
    MetadataValue,
    RunsFilter,
)
from dagster._core.storage.tags import (
    ASSET_PARTITION_RANGE_END_TAG,
    ASSET_PARTITION_RANGE_START_TAG,
    PARTITION_NAME_TAG,
)

from mongocdc_dagster.assets.cdc import plan_window_read
from mongocdc_dagster.landed_history import CollectionHistory, missing_windows
from mongocdc_dagster.metadata import position_time
from mongocdc_dagster.partitions import SliceWindows

GAP_CHECK = "no_gap_since_snapshot"
#: Runs that land missing windows again carry this tag (``mongocdc/reason``), with the value :data:`GAP`.
TAG_REASON = "mongocdc/reason"
GAP = "gap"
#: How many failed runs of a window requested again make it given up.
MAX_REPAIRS = 3
#: The failed repair runs read to count the attempts (newest first).
_FAILED_RUNS_READ = 500
REMEDY = ("snapshot the collection again (an execute-snapshot signal, type incremental, in the signaling "
          "collection, or its snapshot asset): the snapshot then covers the windows that cannot be landed")


def failed_repairs(instance: DagsterInstance) -> list[DagsterRun]:
    """The failed runs that were to land missing windows again."""
    return list(instance.get_runs(filters=RunsFilter(tags={TAG_REASON: GAP}, statuses=[DagsterRunStatus.FAILURE]),
                                  limit=_FAILED_RUNS_READ))


def run_windows(run: DagsterRun) -> tuple[str, str] | None:
    """The first and last window a slice run lands (its partition, or its range)."""
    first = run.tags.get(ASSET_PARTITION_RANGE_START_TAG) or run.tags.get(PARTITION_NAME_TAG)
    last = run.tags.get(ASSET_PARTITION_RANGE_END_TAG) or run.tags.get(PARTITION_NAME_TAG)
    return None if first is None or last is None else (first, last)


def _attempts(runs: Sequence[DagsterRun], key: AssetKey, window_key: str, windows: SliceWindows) -> int:
    start = windows.window(window_key).start
    count = 0
    for run in runs:
        span = run_windows(run)
        if span is None or (run.asset_selection is not None and key not in run.asset_selection):
            continue
        if windows.window(span[0]).start <= start <= windows.window(span[1]).start:
            count += 1
    return count


@dataclass(frozen=True)
class Holes:
    """One collection's closed windows not landed: ``behind`` its last landed window (left by a failed run),
    of which ``landable`` can still be requested and ``lost`` cannot (window -> why); ``pending``: closed
    windows after its last landed one, the schedule's next run's."""

    namespace: str
    behind: tuple[str, ...] = ()
    landable: tuple[str, ...] = ()
    lost: dict[str, str] = field(default_factory=dict)
    pending: tuple[str, ...] = ()


def find_holes(history: CollectionHistory, windows: SliceWindows, key: AssetKey, now: datetime,
               oplog_first: Timestamp | None, failed: Sequence[DagsterRun]) -> Holes:
    """Which of the collection's missing windows can still be landed (``oplog_first`` None: the oplog could not
    be read, so only the attempts decide)."""
    missing = missing_windows(history, windows, now)
    if not missing or not history.window_keys:
        return Holes(history.namespace, pending=tuple(missing))
    last = windows.window(history.window_keys[-1]).start
    behind = [k for k in missing if windows.window(k).start < last]
    landable: list[str] = []
    lost: dict[str, str] = {}
    for window_key in behind:
        if oplog_first is not None:
            read = plan_window_read(window_key, windows.window(window_key), oplog_first, history.snapshot,
                                    landed_before=True)
            if read.gap is not None:
                lost[window_key] = read.gap
                continue
        tried = _attempts(failed, key, window_key, windows)
        if tried >= MAX_REPAIRS:
            lost[window_key] = (f"given up: {tried} runs requested to land it again failed (runs tagged "
                                f"{TAG_REASON}={GAP}; see their errors)")
        else:
            landable.append(window_key)
    return Holes(history.namespace, tuple(behind), tuple(landable), lost,
                 tuple(k for k in missing if windows.window(k).start >= last))


@dataclass(frozen=True)
class GapVerdict:
    """``no_gap_since_snapshot`` of one collection: pass with no window missing, ERROR when one cannot be landed
    any more, WARN while the missing ones can still land (requested again, or the schedule's next run)."""

    holes: Holes
    since: str
    landed: int

    @property
    def passed(self) -> bool:
        return not self.holes.behind and not self.holes.pending

    @property
    def severity(self) -> AssetCheckSeverity:
        return AssetCheckSeverity.ERROR if self.holes.lost else AssetCheckSeverity.WARN

    @property
    def description(self) -> str:
        ns, holes = self.holes.namespace, self.holes
        if self.passed:
            return f"{ns}: every closed window since {self.since} is landed"
        missing = sorted((*holes.behind, *holes.pending))
        text = f"{ns}: {len(missing)} closed window(s) since {self.since} not landed: {_shown(missing)}"
        if holes.lost:
            lost = sorted(holes.lost)
            text += (f"; {len(lost)} cannot be landed any more ({lost[0]}: {holes.lost[lost[0]]}"
                     + (f"; and {len(lost) - 1} more, see lost_windows" if len(lost) > 1 else "") + f"); {REMEDY}")
        if holes.landable:
            text += f"; {len(holes.landable)} behind the last landed window are requested again"
        return text

    @property
    def metadata(self) -> dict[str, Any]:
        holes = self.holes
        missing = sorted((*holes.behind, *holes.pending))
        return {"collection": holes.namespace, "snapshot": self.since, "windows_landed": self.landed,
                "missing_windows": MetadataValue.json(missing[:200]), "missing_count": len(missing),
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
