"""The tables of one captured collection: what the Dagster table assets, the demo and the streaming
job call (the API agreed in ``contracts/tables-dagster.md``).

Each collection has its own ``changelog`` (every change event once, with its position) and
``current_state`` (one typed row per document) Delta table. Both refresh incrementally: the
changelog reads only landing files it has not read, current_state merges only the keys the
changelog gained since its recorded version.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Literal, TypeVar

from delta.exceptions import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.tables import changelog as _changelog
from mongocdc_core.tables import current_state as _state
from mongocdc_core.tables import reconcile as _reconcile
from mongocdc_core.tables.changelog import TableInputError, table_exists
from mongocdc_core.tables.reconcile import SourceRead
from mongocdc_core.tables.spark_progress import Report, SparkWork, reporting

log = logging.getLogger(__name__)
_R = TypeVar("_R")
_T = TypeVar("_T")

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
#: Delta's default ``delta.deletedFileRetentionDuration`` (a week); VACUUM below it needs its check off.
SAFE_RETENTION_HOURS = 168
#: How often a refresh or maintenance is tried when other writers keep committing to its table first.
CONFLICT_ATTEMPTS = 6
#: Delta's optimistic-concurrency failures: another writer committed first (they share no base class).
_CONFLICTS = (
    ConcurrentAppendException, ConcurrentDeleteDeleteException, ConcurrentDeleteReadException,
    ConcurrentTransactionException, ConcurrentWriteException, MetadataChangedException, ProtocolChangedException,
)  # fmt: skip
#: The most collections refreshed at once by default (each keeps a driver thread busy between its jobs).
MAX_CONCURRENCY = 16
#: A collection whose changelog's latest append (its refresh's in a cycle, or where that found nothing new, the
#: one before) added at least this many rows is refreshed again in that cycle when more of it landed meanwhile,
#: and one whose changelog the cycle built when this many rows of it landed meanwhile (:func:`refresh_collections`):
#: a hot collection's new windows do not wait for the next cycle behind the quiet ones, and a quiet one does not
#: pay a refresh twice.
AGAIN_ROWS = 500


@dataclass(frozen=True)
class CollectionTables:
    """Where one collection's two tables live (any Spark path or URI)."""

    namespace: str  # "db.coll"
    changelog: str
    current_state: str

    @classmethod
    def under(
        cls,
        root: str,
        namespace: str,
        *,
        changelog_name: str | None = None,
        current_state_name: str | None = None,
    ) -> CollectionTables:
        """``<root>/<db>__<coll>__changelog`` and ``<root>/<db>__<coll>__current`` (or the names given)."""
        db, dot, coll = namespace.partition(".")
        if not (db and dot and coll):
            raise TableInputError(f"namespace must be '<database>.<collection>', got {namespace!r}")
        base = _NAME_UNSAFE.sub("_", f"{db}__{coll}")
        root = root.rstrip("/")
        return cls(
            namespace,
            f"{root}/{changelog_name or base + '__changelog'}",
            f"{root}/{current_state_name or base + '__current'}",
        )


@dataclass(frozen=True)
class TableOptions:
    """current_state's layout, like the extraction transform's ``delete.handling.mode`` and ``add.fields``."""

    delete_handling: Literal["drop", "rewrite"] = "drop"  # rewrite keeps the row with __deleted = true
    add_fields: tuple[str, ...] = ()  # subset of ("op", "source_ts_ms", "position", "collection")

    def layout(self) -> _state.Layout:
        return _state.Layout(self.delete_handling, tuple(self.add_fields))


@dataclass(frozen=True)
class ChangelogRefresh:
    namespace: str
    files_read: int  # landing files (or file versions) newly read
    rows_added: int
    counts: dict[str, int]  # rows added by op (c/u/d/r)
    row_count: int  # rows in the table after the refresh
    position: str | None  # highest event position in the table (Position.to_str()), None when empty
    schema: T.StructType
    work: SparkWork = field(default_factory=SparkWork)  # the Spark jobs and tasks it ran, and its duration
    # rows the table's latest append added: this refresh's, or where it added none, the one before (how busy it is)
    latest_append: int = 0


@dataclass(frozen=True)
class StateRefresh:
    namespace: str
    keys_merged: int
    upserted: int
    deleted: int
    row_count: int
    position: str | None  # the changelog position the table reflects
    schema: T.StructType
    schema_changes: list[str]  # "added column x", "field y: bigint -> VARIANT"
    pending_keys: int = 0  # updates whose full document has not arrived yet (capture modes without one)
    work: SparkWork = field(default_factory=SparkWork)  # the Spark jobs and tasks it ran, and its duration


@dataclass(frozen=True)
class Reconciliation:
    namespace: str
    matches: bool  # no difference found among the keys compared
    position: str | None  # the table position the comparison was made at
    method: str  # "snapshot read at <cluster time>" or "keys changed since <pos> left out (…)"
    table_rows: int
    source_rows: int
    keys_excluded: int  # keys changed after the position, left out of the comparison
    mismatching_keys: list[str]  # first few, as a user would read them
    keys_compared: int  # keys of either side compared (the rest were left out)
    min_coverage: float = _reconcile.DEFAULT_MIN_COVERAGE
    read_early: bool = False  # the source was read right after the changelog's refresh (``read_source_at``)
    #: The collection was dropped after the table's position, which the server no longer holds: nothing to
    #: compare the data with (the same verdict as a collection discovery already found gone)
    dropped: bool = False

    @property
    def coverage(self) -> float:
        """The share of keys compared (1.0 when neither side has a key: nothing was left out)."""
        total = self.keys_compared + self.keys_excluded
        return self.keys_compared / total if total else 1.0

    @property
    def verified(self) -> bool:
        """Enough keys were compared for the result to say something."""
        return self.coverage >= self.min_coverage

    @property
    def passed(self) -> bool:
        """Equal to the source, having compared at least ``min_coverage`` of the keys; or no difference found
        in what is left of a dropped collection to compare (its metadata with the changelog)."""
        return self.matches and (self.verified or self.dropped)

    @property
    def verdict(self) -> str:
        """``matches``, ``differs``, ``unverified`` (no difference found, too few keys compared) or ``dropped``
        (no difference found; no collection left to compare the data with)."""
        if not self.matches:
            return "differs"
        return "matches" if self.verified else "dropped" if self.dropped else "unverified"

    def summary(self) -> str:
        """How much was verified and the outcome, in one line."""
        total = self.keys_compared + self.keys_excluded
        covered = f"{self.keys_compared} of {total} keys compared ({self.coverage:.0%})"
        if not self.matches:
            return f"{covered}; DIFFERS at {len(self.mismatching_keys)} key(s): {', '.join(self.mismatching_keys[:5])}"
        if not self.verified and self.dropped:
            return (f"{covered}: the collection was dropped after the table's position, which the server no longer "
                    "holds; no collection to compare the data with, its metadata matches the changelog")
        if not self.verified:
            return (f"{covered}, below the {self.min_coverage:.0%} required: NOT VERIFIED (no difference found, "
                    "but the table's position left the server's snapshot history and too many keys changed since; "
                    "reconcile right after a refresh)")
        return f"{covered}; matches"


def refresh_changelog(
    spark: SparkSession, tables: CollectionTables, landing_files: Sequence[str], *, progress: Report | None = None
) -> ChangelogRefresh:
    """Append the events of the landing files (or file versions) not read before; ``progress`` gets a
    line every few seconds while Spark works (tasks done, rate, ETA) and one when it is done.

    Idempotent: re-delivering the same files or events adds nothing; a re-written file adds only
    the events it did not hold. Rows of other collections in the files are ignored.
    """
    with reporting(spark, f"changelog of {tables.namespace}", progress) as work:
        result = _retrying_conflicts(
            f"{tables.namespace}: changelog refresh",
            lambda: _changelog.refresh(spark, tables.namespace, tables.changelog, landing_files),
        )
    return ChangelogRefresh(
        namespace=tables.namespace,
        files_read=result.files_read,
        rows_added=result.appended.rows,
        counts=result.appended.counts,
        row_count=result.row_count,
        position=result.position,
        schema=result.schema,
        work=work,
        latest_append=result.latest_append,
    )


def refresh_current_state(
    spark: SparkSession, tables: CollectionTables, options: TableOptions | None = None, *,
    progress: Report | None = None,
) -> StateRefresh:
    """Merge what the changelog gained since the table's recorded version (a full build the first
    time, or when ``options`` changed); ``progress`` as for :func:`refresh_changelog`."""
    layout = (options or TableOptions()).layout()
    with reporting(spark, f"current_state of {tables.namespace}", progress) as work:
        result = _retrying_conflicts(
            f"{tables.namespace}: current_state refresh",
            lambda: _state.refresh(spark, tables.namespace, tables.changelog, tables.current_state, layout),
        )
    return StateRefresh(
        namespace=tables.namespace,
        keys_merged=result.keys_merged,
        upserted=result.upserted,
        deleted=result.deleted,
        row_count=result.row_count,
        position=result.position,
        schema=result.schema,
        schema_changes=result.schema_changes,
        pending_keys=result.pending,
        work=work,
    )


@dataclass(frozen=True)
class CollectionRefresh:
    """One collection's part of a cycle: its two refreshes (those it was given), or the error that stopped
    them (after its changelog's refresh, when that one is set)."""

    namespace: str
    changelog: ChangelogRefresh | None = None
    current_state: StateRefresh | None = None
    error: Exception | None = None
    landing_files: Sequence[str] | None = None  # the landing files its (last) changelog refresh was given

    @property
    def new_data(self) -> bool:
        """Whether the cycle found anything new for this collection (a landing file read, a key merged)."""
        return bool((self.changelog and self.changelog.files_read) or (self.current_state and self.current_state.keys_merged))

    def then(self, later: CollectionRefresh | Exception) -> CollectionRefresh:
        """This refresh followed by a ``later`` one in the same cycle (or the error that stopped it): the
        figures of both summed, the table's state (rows, position, schema) as the later left it."""
        if isinstance(later, Exception):
            return replace(self, error=later)
        return CollectionRefresh(
            self.namespace,
            _then_log(self.changelog, later.changelog),
            _then_state(self.current_state, later.current_state),
            later.error,
            later.landing_files,
        )


def _work(first: SparkWork, later: SparkWork) -> SparkWork:
    return SparkWork(first.jobs + later.jobs, first.tasks + later.tasks, first.seconds + later.seconds)


def _then_log(first: ChangelogRefresh | None, later: ChangelogRefresh | None) -> ChangelogRefresh | None:
    if first is None or later is None:
        return later or first
    return replace(later, files_read=first.files_read + later.files_read, rows_added=first.rows_added + later.rows_added,
                   counts=dict(Counter(first.counts) + Counter(later.counts)), work=_work(first.work, later.work))


def _then_state(first: StateRefresh | None, later: StateRefresh | None) -> StateRefresh | None:
    if first is None or later is None:
        return later or first
    return replace(later, keys_merged=first.keys_merged + later.keys_merged, upserted=first.upserted + later.upserted,
                   deleted=first.deleted + later.deleted, schema_changes=[*first.schema_changes, *later.schema_changes],
                   work=_work(first.work, later.work))


def default_concurrency(spark: SparkSession) -> int:
    """Collections refreshed at once by default: at least 4 (a refresh of a few changes leaves the
    executors idle between its jobs, so two cores serve several), more on a larger cluster."""
    return min(MAX_CONCURRENCY, max(4, spark.sparkContext.defaultParallelism))


def concurrently(
    spark: SparkSession, items: Sequence[_T], action: Callable[[SparkSession, _T], _R], *, concurrency: int | None = None,
    again: Callable[[_T, _R], Callable[[], bool] | None] | None = None,
    combine: Callable[[_R, _R | Exception], _R] | None = None,
) -> Iterator[tuple[_T, _R | Exception]]:
    """``action(session, item)`` for every item, up to ``concurrency`` at once (default
    :func:`default_concurrency`), yielded as each finishes: its result, or the exception it raised.

    Independent tables' Spark jobs then run side by side: each item runs in its own Spark session (its
    own SQL settings, such as the shuffle partitions a refresh sizes, over the shared SparkContext) and
    its own scheduler pool, which Spark's FAIR scheduler serves in turn (:func:`.session.spark_conf`
    turns it on). Each such session starts with the SQL settings ``spark`` has, those set at run time
    too (credentials such as ``fs.s3a.*`` given with ``spark.conf.set``). With a concurrency of 1 the
    items run one after another in ``spark``.

    ``again(item, result)`` (with ``combine``), asked of each item done without error while others are queued
    or running: None, or a probe saying whether the item should run once more. Such an item is held back
    and its probe asked whenever a slot frees while other items are queued or running; once it says so, the
    item runs again in that slot, ahead of the queued items, and is yielded after that, as
    ``combine(first result, second result or the exception it raised)``. An item whose probe never says
    so is yielded when no other item is queued or running.
    """
    if concurrency is not None and concurrency < 1:
        raise TableInputError(f"concurrency must be at least 1, got {concurrency}")
    width = min(len(items), concurrency or default_concurrency(spark))
    context = spark.sparkContext
    slots = list(range(width))
    settings = _run_time_settings(spark) if width > 1 else {}

    def run(item: _T) -> _R:
        slot = slots.pop()
        kept = context.getLocalProperty("spark.scheduler.pool")
        context.setLocalProperty("spark.scheduler.pool", f"mongocdc-{slot}")
        try:
            session = spark.newSession()
            for key, value in settings.items():
                session.conf.set(key, value)
            return action(session, item)
        finally:
            context.setLocalProperty("spark.scheduler.pool", kept)  # type: ignore[arg-type]  # None removes it
            slots.append(slot)

    pool = ThreadPoolExecutor(width, thread_name_prefix="mongocdc-tables") if width > 1 else None

    def start(index: int) -> Future[_R]:
        if pool is not None:
            return pool.submit(run, items[index])
        done: Future[_R] = Future()  # one at a time: run here, in ``spark``
        try:
            done.set_result(action(spark, items[index]))
        except Exception as exc:  # the caller decides what one item's failure means
            done.set_exception(exc)
        return done

    queued = deque(range(len(items)))
    held: dict[int, _R] = {}  # first results of the items that may run again or are running again
    probes: dict[int, Callable[[], bool]] = {}  # of the held items not running again, in the order they finished
    running: dict[Future[_R], int] = {}
    try:
        while True:
            while len(running) < width:  # a free slot: a held item that should run again, else the next queued
                index = next((i for i, grown in probes.items() if grown()), None) if queued or running else None
                if index is not None:
                    del probes[index]
                elif queued:
                    index = queued.popleft()
                else:
                    break
                running[start(index)] = index
            if not queued and not running:  # the others are done: the held items run no more
                for index in list(probes):
                    del probes[index]
                    yield items[index], held.pop(index)
                return
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                index = running.pop(future)
                error = future.exception()
                if error is not None and not isinstance(error, Exception):  # an interrupt stops the cycle
                    raise error
                outcome = error if error is not None else future.result()
                if index in held:  # its second run
                    assert combine is not None
                    yield items[index], combine(held.pop(index), outcome)
                    continue
                probe = again(items[index], future.result()) if again and error is None and (queued or running) else None
                if probe is not None:
                    held[index], probes[index] = future.result(), probe
                else:
                    yield items[index], outcome
    finally:
        # an interrupt, a caller that stops early or a run terminated: the queued collections never start
        # (the running ones finish their Spark jobs), instead of the whole cycle running to its end first
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _run_time_settings(spark: SparkSession) -> dict[str, str]:
    """The SQL settings of ``spark`` a new session over its SparkContext would not start with (those set at
    run time, Hadoop's ``fs.*`` keys among them), found once per cycle: one new session compared with
    ``spark`` (static settings are the SparkContext's, the same in both)."""
    fresh = spark.newSession().conf
    return {key: value for key, value in spark.conf.getAll.items() if fresh.get(key, None) != value}


def refresh_collections(
    spark: SparkSession,
    work: Sequence[tuple[CollectionTables, Sequence[str] | None]],
    options: TableOptions | None = None,
    *,
    concurrency: int | None = None,
    progress: Report | None = None,
    states: Collection[str] | None = None,
    after_changelog: Callable[[CollectionTables, ChangelogRefresh], None] | None = None,
    landed: Callable[[CollectionTables], Sequence[str]] | None = None,
    again_rows: int = AGAIN_ROWS,
) -> Iterator[CollectionRefresh]:
    """One refresh cycle over many collections: for each ``(tables, landing files)`` its changelog, then its
    current_state, several collections at once (see :func:`concurrently`), yielded as each finishes. Each
    collection's current_state follows its own changelog, not every collection's: the first collections'
    tables are up to date while the others still refresh.

    A collection whose landing files are those its last refresh read, unchanged, costs no Spark job (the
    state its tables' last commits recorded decides), so a cycle costs what landed, not how many collections
    there are. Landing files None: that collection's changelog is not refreshed; ``states``: the namespaces
    whose current_state is (default all). ``after_changelog(tables, refresh)`` runs right after a
    collection's changelog refresh, before its current_state's (to read the source at the position
    current_state is about to get: :func:`read_source_at`).

    ``landed(tables)``: the collection's landing files as they are now. Given, a busy collection is refreshed
    once more, ahead of the collections still queued, when more of it landed while other collections were
    still queued or refreshing: its new windows do not wait behind the quiet ones for the next cycle. Busy:
    its changelog's latest append added at least ``again_rows`` rows (this refresh's, or where it found nothing
    new, the one before, so a cycle that starts just before its next window lands still waits for it), and
    then a landing file holding events is more of it; or its changelog was built by this refresh (nothing
    tells yet how busy it is, as in a deployment's first cycle, which its snapshot starts), and then only
    landing files holding ``again_rows`` rows in all are. It is yielded after that, the figures of both
    refreshes summed (:meth:`CollectionRefresh.then`), or, when no more came, once the others are done.
    One collection's failure is its :class:`CollectionRefresh`'s ``error`` (with its changelog's refresh when
    only its current_state's failed); the others go on.
    """
    given = {tables.namespace: files for tables, files in work}  # the files each one's latest refresh is given
    unlisted: set[str] = set()  # collections whose landing files could not be looked at again (said once)

    def both(session: SparkSession, item: tuple[CollectionTables, Sequence[str] | None]) -> CollectionRefresh:
        tables = item[0]
        files = given[tables.namespace]
        log_refresh = None
        if files is not None:
            log_refresh = refresh_changelog(session, tables, files, progress=progress)
            if after_changelog is not None:
                after_changelog(tables, log_refresh)
        if states is not None and tables.namespace not in states:
            return CollectionRefresh(tables.namespace, log_refresh, landing_files=files)
        try:
            state = refresh_current_state(session, tables, options, progress=progress)
        except Exception as exc:  # the changelog's refresh stands; the caller reports both
            return CollectionRefresh(tables.namespace, log_refresh, error=exc, landing_files=files)
        return CollectionRefresh(tables.namespace, log_refresh, state, landing_files=files)

    def hot(item: tuple[CollectionTables, Sequence[str] | None], first: CollectionRefresh) -> Callable[[], bool] | None:
        """A probe for a busy collection (None for the others): the rows that must land for a second refresh."""
        log_refresh, files = first.changelog, given[item[0].namespace]
        if landed is None or files is None or first.error is not None or log_refresh is None:
            return None
        if log_refresh.latest_append >= again_rows:
            least = 1
        elif 0 < log_refresh.rows_added == log_refresh.row_count:  # its table was built by this refresh
            least = again_rows
        else:
            return None
        return partial(grown, item[0], landed, frozenset(files), least, {})

    def grown(tables: CollectionTables, listing: Callable[[CollectionTables], Sequence[str]], had: frozenset[str],
              least: int, rows: dict[str, int | None]) -> bool:
        """Whether landing files holding at least ``least`` rows in all came since the collection's refresh was
        given the files ``had`` (then its next refresh is given them all). ``rows``: those of each new file
        looked at so far (None where its footer is not read here: a file behind a URI, which counts as holding
        events but no number of rows), so each poll reads only the footers of files it has not seen."""
        namespace = tables.namespace
        if namespace in unlisted:
            return False
        try:
            now = list(listing(tables))
            for path in now:
                if path not in had and path not in rows:
                    rows[path] = _changelog.landed_rows(path)
        except Exception as exc:  # no second refresh; the next cycle reads the files, and says what is wrong
            unlisted.add(namespace)
            (progress or log.warning)(f"{namespace}: its landing files could not be looked at again in this cycle "
                                      f"({type(exc).__name__}: {exc}); the next refresh reads them")
            return False
        came = [rows[path] for path in now if path not in had]
        fresh = any(n is None or n > 0 for n in came) if least == 1 else sum(n or 0 for n in came) >= least
        if fresh:
            given[namespace] = now
            (progress or log.info)(f"{namespace}: more of it landed meanwhile; refreshed again in this cycle")
        return fresh

    for (tables, _), outcome in concurrently(spark, work, both, concurrency=concurrency,
                                             again=hot, combine=CollectionRefresh.then):
        yield outcome if isinstance(outcome, CollectionRefresh) else CollectionRefresh(tables.namespace, error=outcome)


def read_source_at(spark: SparkSession, tables: CollectionTables, cfg: ConnectorConfig) -> SourceRead:
    """The collection read at the position the next refresh of current_state gives the table (the
    changelog's highest position at its latest version): call it right after :func:`refresh_changelog`,
    while the server still holds that position (its snapshot history, 300 s by default), and give it to
    :func:`reconcile_at_position` once current_state is refreshed. It holds the collection's rows in Arrow
    form (about the size of its documents as JSON) until dropped; one Spark job and a read through pymongo.
    A refresh of current_state from a later changelog version makes it stale: it is then not used."""
    return _reconcile.read_source(spark, tables.namespace, tables.changelog, cfg)


def reconcile_at_position(
    spark: SparkSession, tables: CollectionTables, cfg: ConnectorConfig, *, progress: Report | None = None,
    min_coverage: float = _reconcile.DEFAULT_MIN_COVERAGE, source: SourceRead | None = None,
) -> Reconciliation:
    """Compare current_state with the MongoDB collection as it was at the table's position (passes
    under continuous writes, fails on a corrupted row, is not verified below ``min_coverage`` of the keys
    compared); see :mod:`mongocdc_core.tables.reconcile`. ``progress`` as for :func:`refresh_changelog`.
    ``source``: the collection read early (:func:`read_source_at`), used when it is for the changelog
    version and position the table now holds (``read_early``); otherwise it is read now."""
    _reconcile.coverage_share(min_coverage)
    with reporting(spark, f"reconciliation of {tables.namespace}", progress):
        found = _reconcile.compare(spark, tables.namespace, tables.changelog, tables.current_state, cfg, source)
    return Reconciliation(
        namespace=tables.namespace,
        matches=not found.mismatching_keys,
        position=found.position,
        method=found.method,
        table_rows=found.table_rows,
        source_rows=found.source_rows,
        keys_excluded=found.keys_excluded,
        mismatching_keys=found.mismatching_keys,
        keys_compared=found.keys_compared,
        min_coverage=min_coverage,
        read_early=found.read_early,
        dropped=found.dropped,
    )


def maintain(
    spark: SparkSession, tables: CollectionTables, *, retention_hours: int = 168, progress: Report | None = None
) -> dict[str, int]:
    """OPTIMIZE (compaction) and VACUUM (files unreferenced for ``retention_hours``) of both tables;
    ``progress`` as for :func:`refresh_changelog`.

    Keep the retention longer than the time between current_state refreshes: a refresh reads the
    changelog's change data feed since its last run, and VACUUM removes what that feed needs (the
    refresh then rebuilds the table from the whole changelog).
    """
    if retention_hours < 0:
        raise TableInputError(f"retention_hours must be >= 0, got {retention_hours}")
    figures: dict[str, int] = {}
    for kind, location in (("changelog", tables.changelog), ("current_state", tables.current_state)):
        if not table_exists(spark, location):
            continue
        with reporting(spark, f"maintenance of {tables.namespace} {kind}", progress):
            table = DeltaTable.forPath(spark, location)
            metrics = _retrying_conflicts(f"{tables.namespace}: OPTIMIZE of {kind}", partial(_compact, table))
            figures[f"{kind}_files_added"] = int(metrics.get("numFilesAdded") or 0)
            figures[f"{kind}_files_removed"] = int(metrics.get("numFilesRemoved") or 0)
            before = _file_count(spark, location)
            with _vacuum_settings(spark, retention_hours):
                table.vacuum(retention_hours)
            figures[f"{kind}_files_vacuumed"] = max(0, before - _file_count(spark, location))
    return figures


#: Spark's setting for the tasks that list a table's files; VACUUM lists with it, and its default (10,000
#: tasks) made each VACUUM of a small table take 30 s on two cores for one directory to list.
_LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


@contextmanager
def _vacuum_settings(spark: SparkSession, retention_hours: int) -> Iterator[None]:
    """VACUUM lists the table's files in as many tasks as the cluster has cores, not in Spark's 10,000.

    Delta refuses a VACUUM below its week of retention unless its safety check is off: the operator
    chose the retention, so it is off for this call (with a warning) and restored after it."""
    with ExitStack() as settings:
        cores = max(1, spark.sparkContext.defaultParallelism)
        settings.enter_context(_changelog.setting(spark, _LISTING_PARALLELISM, str(cores)))
        if retention_hours < SAFE_RETENTION_HOURS:
            log.warning("VACUUM with %d hours of retention (Delta's default is %d): readers of older versions and a "
                        "refresh that has not run for that long lose the files they need", retention_hours, SAFE_RETENTION_HOURS)  # fmt: skip
            settings.enter_context(
                _changelog.setting(spark, "spark.databricks.delta.retentionDurationCheck.enabled", "false"))
        yield


def _compact(table: DeltaTable) -> dict[str, Any]:
    """OPTIMIZE's metrics (files added and removed)."""
    optimized = table.optimize().executeCompaction().select("metrics").first()
    return optimized[0].asDict() if optimized is not None and optimized[0] is not None else {}


def _retrying_conflicts(what: str, action: Callable[[], _R]) -> _R:
    """``action`` again, after a pause, when another writer committed to its table first.

    Delta's optimistic concurrency fails the writer that commits second: a user's repair, OPTIMIZE, a
    second refresh where the tables pool allows more than one. Every refresh is idempotent (positions
    decide what a MERGE changes, the changelog skips events it holds, and it starts again from the
    table's recorded version), so trying again against the new table version is safe.
    """
    for attempt in range(1, CONFLICT_ATTEMPTS):
        try:
            return action()
        except _CONFLICTS as e:
            pause = min(30.0, 0.5 * 2**attempt) * random.uniform(0.5, 1.0)
            log.warning("%s lost a commit to a concurrent writer (attempt %d of %d), trying again in %.1f s: %s",
                        what, attempt, CONFLICT_ATTEMPTS, pause, (str(e).splitlines() or [""])[0])  # fmt: skip
            time.sleep(pause)
    return action()  # the last attempt: its conflict is raised


def _file_count(spark: SparkSession, location: str) -> int:
    """Data files in the table's directory (referenced or not), as VACUUM sees them."""
    jvm: Any = spark._jvm
    path = jvm.org.apache.hadoop.fs.Path(location)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())  # type: ignore[attr-defined]
    files = fs.listFiles(path, True)
    count = 0
    while files.hasNext():
        name = files.next().getPath().toString()
        if name.endswith(".parquet") and "/_delta_log/" not in name and "/_mongocdc_landing/" not in name:
            count += 1
    return count


def combined_changelog(spark: SparkSession, tables: Sequence[CollectionTables]) -> DataFrame:
    """Every given collection's changelog as one DataFrame (``__collection`` tells them apart)."""
    frames = [_changelog.read_changelog(spark, t.changelog) for t in tables]
    if not frames:
        return spark.createDataFrame([], _changelog.CHANGELOG_SCHEMA)
    combined = frames[0]
    for frame in frames[1:]:
        combined = combined.unionByName(frame)
    return combined
