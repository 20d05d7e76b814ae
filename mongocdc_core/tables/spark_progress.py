"""Progress of a table refresh, read from Spark's status tracker: tasks done, rate and ETA.

A full build of a large changelog runs for minutes or hours inside a few Spark jobs, and the run log
would stay silent until it ends. Spark knows no row counts before a stage ends, so progress is
counted in tasks, the unit of Spark's own console bar; the ETA assumes the running stage's
remaining tasks go at the rate its finished ones did. The refresh's jobs are told apart from other
work in the session by a job group set on the calling thread (the one it had is restored after).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from pyspark import SparkContext
from pyspark.sql import SparkSession

from mongocdc_core.receiver import duration

log = logging.getLogger(__name__)

#: Where progress lines go (a logger's ``info``, a Dagster run log, ``print``).
Report = Callable[[str], None]
#: The local properties a job group is made of (kept and restored around a block).
GROUP_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")
_GROUPS = itertools.count()


@dataclass
class SparkWork:
    """What a refresh ran: its Spark jobs and the tasks they completed, and how long it took."""

    jobs: int = 0
    tasks: int = 0
    seconds: float = 0.0


class _Watcher(threading.Thread):
    """Polls the status tracker every ``every_s`` and reports the running stage of the group's jobs."""

    def __init__(self, context: SparkContext, group: str, label: str, report: Report, every_s: float,
                 started: float) -> None:  # fmt: skip
        super().__init__(name=f"mongocdc-progress-{group}", daemon=True)
        self.tracker = context.statusTracker()
        self.group, self.label, self.report, self.every_s = group, label, report, every_s
        self.started = started  # when the block began (monotonic), for "running <elapsed>"
        self.halt = threading.Event()
        self._first: dict[int, tuple[float, int]] = {}  # stage -> (when first seen running, tasks done then)

    def run(self) -> None:
        while not self.halt.wait(self.every_s):
            try:
                line = self.line()
            except Exception as exc:  # the session stopping under the poll; progress must never fail a refresh
                log.debug("progress of %s: status tracker unavailable: %s", self.label, exc)
                return
            if line is not None:
                self.report(line)

    def line(self) -> str | None:
        """``<label>: stage 3 of Spark job 12: 150 of 400 tasks (37%), 24.0 tasks/s, ETA 10 s; 2 jobs done,
        running 1 min 04 s`` (None while no stage runs)."""
        jobs = [info for job in self.tracker.getJobIdsForGroup(self.group)
                if (info := self.tracker.getJobInfo(job)) is not None]  # fmt: skip
        done = sum(1 for info in jobs if info.status == "SUCCEEDED")
        elapsed = duration(time.monotonic() - self.started)
        for info in sorted(jobs, key=lambda j: j.jobId):
            if info.status != "RUNNING":
                continue
            for stage_id in sorted(info.stageIds):
                stage = self.tracker.getStageInfo(stage_id)
                if stage is None or stage.numActiveTasks == 0:
                    continue
                now = time.monotonic()
                since, then = self._first.setdefault(stage_id, (now, stage.numCompletedTasks))
                rate = (stage.numCompletedTasks - then) / (now - since) if now > since else 0.0
                left = stage.numTasks - stage.numCompletedTasks
                eta = duration(left / rate) if rate > 0 else "unknown"
                return (f"{self.label}: stage {stage_id} of Spark job {info.jobId}: {stage.numCompletedTasks} of "
                        f"{stage.numTasks} tasks ({100 * stage.numCompletedTasks // max(stage.numTasks, 1)}%), "
                        f"{rate:.1f} tasks/s, ETA {eta}; {done} job(s) done, running {elapsed}")  # fmt: skip
        return None


@contextmanager
def reporting(spark: SparkSession, label: str, report: Report | None = None, every_s: float = 10.0
              ) -> Iterator[SparkWork]:  # fmt: skip
    """Count the Spark work done inside the block (the yielded :class:`SparkWork` is filled in when it
    ends) and, given ``report``, report its progress every ``every_s`` while a stage runs, then once
    what it ran: ``<label>: done in 12 s, 7 Spark job(s), 52 task(s)``."""
    context = spark.sparkContext
    kept = {key: context.getLocalProperty(key) for key in GROUP_PROPERTIES}
    group = f"mongocdc-{next(_GROUPS)}-{threading.get_ident()}"
    context.setJobGroup(group, label)
    started = time.monotonic()
    watcher = _Watcher(context, group, label, report, every_s, started) if report is not None else None
    if watcher is not None:
        watcher.start()
    work = SparkWork()
    try:
        yield work
    except BaseException:
        _restore(context, kept, watcher, failed=True)
        raise
    _restore(context, kept, watcher, failed=False)
    work.jobs, work.tasks = _totals(context, group)
    work.seconds = time.monotonic() - started
    if report is not None:
        report(f"{label}: done in {duration(work.seconds)}, {work.jobs} Spark job(s), {work.tasks} task(s)")


def _restore(context: SparkContext, kept: dict[str, str | None], watcher: _Watcher | None, *, failed: bool) -> None:
    """Stop watching and give the thread back the job group it had. After a failed block (the session
    may be gone) a failure here is logged, so it does not hide the block's own error."""
    if watcher is not None:
        watcher.halt.set()
        watcher.join()
    try:
        for key, value in kept.items():
            context.setLocalProperty(key, value)  # type: ignore[arg-type]  # None removes it (Spark's null)
    except Exception as exc:
        if not failed:
            raise
        log.warning("could not restore the Spark job group after a failed refresh: %s", exc)


def _totals(context: SparkContext, group: str) -> tuple[int, int]:
    """The group's jobs and the tasks their stages completed."""
    tracker = context.statusTracker()
    jobs = tasks = 0
    for job in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job)
        if info is None:
            continue
        jobs += 1
        for stage_id in info.stageIds:
            stage = tracker.getStageInfo(stage_id)
            tasks += stage.numCompletedTasks if stage is not None else 0
    return jobs, tasks
