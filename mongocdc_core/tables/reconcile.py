"""Does a collection's ``current_state`` equal MongoDB *at the table's position*? Two comparisons:

1. **The data a user reads** (``_id``, every typed column, ``__doc``) against the collection as it was
   at the table's position. The source side is read through the engine (``api.snapshot_collection``),
   so field transforms apply as they did to the events, and converted by the same Spark expressions
   with the table's own column types, then compared row by row on the exact key. Preferably the read
   is a snapshot read at that cluster time (the tick before it where the table's newest rows are a
   blocking snapshot's reads: that position is where the snapshot's change stream starts, and a write
   may take it); where the server no longer holds it (or cannot), the collection is read now and the
   keys the change stream shows changed since are left out of the comparison, and counted. Either way
   the check holds while writes continue. A blocking snapshot's copy is fuzzy, as Debezium's is (it
   reads while writers write, so a document may show a write made after the snapshot's position; the
   stream from that position makes it exact). A read can only show a write made after the table's time
   if the copy made it after that time, so where the table still holds a key as a read made then (its
   processing time, ``__ts_ms``, :func:`_read_late`) and the key changed after the table's time, or lacks
   a key while the copy's newest read was made then, a difference there is uncertain: the key is left
   out and counted too (equal, it is verified). An update's full document is fuzzy the same way: the change
   stream looks it up when it reads the event (``updateLookup``), so it may show writes made after the
   update, and after the table's time when it was read after that time. A read made before the table's
   time, an insert's, a delete's and an update read before the table's time are exact at its position: a
   difference there is one.
2. **The metadata columns** (``__position``, ``__op``, ``__source_ts_ms``, ``__deleted``) against the
   winning event of each key in the changelog version the table reflects.

Every comparison says how much it verified: the keys compared of all keys of both sides (the keys left
out are not verified). A comparison that verified less than ``min_coverage`` of them is no pass, even
with no difference found: where every key changed since the table's position, it compared nothing. One
exception: a collection dropped after that position, which the server no longer holds, has no data to
compare the table with (its verdict is ``dropped``, as when discovery already found it gone); its metadata
is still compared with the changelog.

The source may be read early (:func:`read_source`), right after the changelog's refresh: the position
the next current_state refresh gives the table is then known (that changelog version's highest), and
the server still holds it; :func:`compare` uses that read when the table it compares was folded from
the same changelog version to the same position, and reads the source itself otherwise.

MongoDB is read only through :mod:`mongocdc_core.api`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson
import pyarrow as pa
from bson import Timestamp
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from mongocdc_core import api
from mongocdc_core.config import ConnectorConfig
from mongocdc_core.events.records import Record
from mongocdc_core.positions import Position
from mongocdc_core.sinks.parquet import landing_table
from mongocdc_core.sinks.readback import key_id
from mongocdc_core.tables import typed_columns
from mongocdc_core.tables.changelog import (
    POSITION_PROPERTY,
    SNAPSHOT_PROPERTY,
    TableInputError,
    changelog_rows,
    interpreted,
    look,
    size_at,
)
from mongocdc_core.tables.current_state import (
    _SMALL_TABLE_BYTES,
    KINDS_PROPERTY,
    OPTIONS_PROPERTY,
    VERSION_PROPERTY,
    Layout,
    Shape,
    _small_plans,
    columns,
    sized_shuffles,
)

MAX_REPORTED_KEYS = 20
#: The share of keys a reconciliation must compare to pass. A check run with the refresh that produced
#: the table reads at its position (coverage 1); below this, too many keys changed since to say anything.
DEFAULT_MIN_COVERAGE = 0.9


def coverage_share(value: float, name: str = "min_coverage") -> float:
    """``value`` when it is a share between 0 and 1 (a required coverage); a ValueError naming it otherwise."""
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a share between 0 and 1, got {value!r}")
    return value


@dataclass(frozen=True)
class Comparison:
    """What :func:`compare` found (``collection.Reconciliation`` is built from it)."""

    position: str | None
    method: str
    table_rows: int
    source_rows: int
    keys_excluded: int
    keys_compared: int
    mismatching_keys: list[str]
    read_early: bool = False  # the source was read right after the changelog's refresh (:func:`read_source`)
    dropped: bool = False  # the collection is gone and the server no longer holds the table's position


class _Rows:
    """A sink keeping the data records it gets (the source side, in memory) for their landing-zone rows."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def write(self, records: Sequence[Record]) -> None:
        self.records.extend(r for r in records if r.op is not None)

    def flush(self, timeout: float | None = None) -> None:
        """Nothing buffered."""

    def close(self) -> None:
        """Nothing to close."""

    def keys(self) -> set[str]:
        """The exact key (``__key``) of every row."""
        return {kid for r in self.records if r.key is not None and (kid := key_id(orjson.loads(r.key))) is not None}


def _layout(props: dict[str, str]) -> Layout:
    data = orjson.loads(props[OPTIONS_PROPERTY])
    return Layout(data["delete_handling"], tuple(data["add_fields"]))


def _table_time(log: DataFrame, position: str) -> tuple[Timestamp, str, bool, bool]:
    """The cluster time whose state a table at ``position`` holds, how to say it, whether a blocking
    snapshot's read in ``log`` may have been made after it, and whether any document that may show later
    writes (such a read, an update's looked-up document: :func:`_fuzzy_document`) was (:func:`_read_late`):
    one Spark job.

    After a change event at ``position`` it is that event's clusterTime: every event up to it was
    applied. When only a blocking snapshot's reads are at ``position`` it is the tick before: a
    snapshot's position is where its change stream starts, mongod's latest operation time plus one
    tick, so the next write takes that very time; its reads hold the state before it, and a write at
    that time comes from the stream (sorted after the reads). Incremental snapshot reads take the
    position of their close watermark, an event that came after the state they hold. Where no read was
    made late, no key changed since is uncertain (none is asked for)."""
    at = Position.parse(position).timestamp
    before = Timestamp(at.time, at.inc - 1) if at.inc else Timestamp(at.time - 1, 0xFFFFFFFF)
    event = (F.col("__position") == position) & (
        (F.col("__op") != "r") | F.coalesce(F.col("snapshot") == "incremental", F.lit(False)))
    facts = log.agg(
        F.max(event).alias("event"),
        F.max(_blocking_read() & _read_late(at)).alias("copy_at"),
        F.max(_blocking_read() & _read_late(before)).alias("copy_before"),
        F.max(_fuzzy_document() & _read_late(at)).alias("late_at"),
        F.max(_fuzzy_document() & _read_late(before)).alias("late_before"),
    ).first()
    assert facts is not None  # a global aggregation has one row
    if facts["event"]:
        return at, f"{at.time}.{at.inc}", bool(facts["copy_at"]), bool(facts["late_at"])
    said = f"{before.time}.{before.inc} (the tick before the snapshot's position {at.time}.{at.inc}, where its stream starts)"
    return before, said, bool(facts["copy_before"]), bool(facts["late_before"])


def _changed_since(cfg: ConnectorConfig, namespace: str, at: Timestamp) -> set[str]:
    """The keys of every change event after cluster time ``at`` up to now (from the change stream)."""
    now = api.current_cluster_time(cfg)
    start = Timestamp(at.time, at.inc + 1) if at.inc < 0xFFFFFFFF else Timestamp(at.time + 1, 0)
    end = Timestamp(now.time, now.inc + 1)
    changed = _Rows()
    if (start.time, start.inc) < (end.time, end.inc):
        api.stream_window(cfg, namespace, start, end, changed)
    return changed.keys()


@dataclass(frozen=True)
class SourceRead:
    """The collection read for a table at ``position`` folded from changelog version ``changelog_version``
    (:func:`read_source`): its landing rows (Arrow, columnar: about the size of the collection's documents
    as JSON), the keys to leave out, and how it was read. ``changed``: keys changed since the table's time
    to leave out; ``fuzzy_at`` (the table's time, where the source was read at it): of those, only the ones
    the table holds as a document read after that time (a blocking snapshot's copy, an update's looked-up
    document) or, where the copy read after it (``copy_late``), lacks, where they differ from the source then."""

    changelog_version: int
    position: str | None
    rows: pa.Table
    changed: frozenset[str]
    fuzzy_at: Timestamp | None
    method: str
    copy_late: bool = False  # a blocking snapshot's copy read after ``fuzzy_at``: a key it lacks is uncertain
    #: The collection was dropped after the table's position, which the server no longer holds: there is no
    #: collection to compare the data with (every key left out), only the metadata with the changelog.
    dropped: bool = False

    def holds(self, changelog_version: int, position: str | None) -> bool:
        """Whether this read is for a table folded from ``changelog_version`` up to ``position``."""
        return (self.changelog_version, self.position) == (changelog_version, position)


def read_source(spark: SparkSession, namespace: str, changelog: str, cfg: ConnectorConfig) -> SourceRead:
    """The collection as it was at the position a refresh of current_state from ``changelog``'s latest
    version gives the table (that version's highest position, as the changelog's refresh
    recorded), read now: right after the changelog's refresh, the server still holds that position
    (its snapshot history, 300 s by default) while current_state is refreshed and a check runs later.
    :func:`compare` uses it when the table it compares was folded from that version."""
    found = look(spark, changelog)
    if found.version < 0:
        raise TableInputError(f"{namespace}: no changelog table at {changelog}: refresh it first")
    log = spark.read.format("delta").option("versionAsOf", found.version).load(changelog)
    return _read(cfg, namespace, found.version, found.properties.get(POSITION_PROPERTY), log)


def _read(cfg: ConnectorConfig, namespace: str, version: int, position: str | None, log: DataFrame) -> SourceRead:
    """The collection at ``position`` (the highest of ``log``, changelog version ``version``)."""
    rows = _Rows()
    if position is None:
        api.snapshot_collection(cfg, namespace, rows, filter={})
        return SourceRead(version, position, landing_table(rows.records), frozenset(), None,
                          "read now (the table has no position yet)")
    at, said, copy_late, late = _table_time(log, position)
    try:
        api.snapshot_collection(cfg, namespace, rows, filter={}, at_cluster_time=at)
    except api.SnapshotReadUnavailable as exc:
        reason = str(exc)
    else:
        changed = frozenset(_changed_since(cfg, namespace, at)) if late else frozenset()
        return SourceRead(version, position, landing_table(rows.records), changed, at, f"snapshot read at {said}" + (
            "; keys changed since that differ where the table holds them as a blocking snapshot's copy or an "
            "update's looked-up document read them after that time, or lacks them while the copy read after it, "
            "left out (the copy may have read them after that time)" if changed else ""), copy_late)
    rows = _Rows()
    api.snapshot_collection(cfg, namespace, rows, filter={})
    # changed since: every event after the time the table holds (the snapshot's own position included); a
    # collection dropped since changed every key it had, which the drop's one event does not name
    changed = frozenset(_changed_since(cfg, namespace, at))
    dropped = namespace not in api.list_captured_collections(cfg)
    if dropped:
        changed |= {row["__key"] for row in log.select("__key").distinct().collect()}
        reason += "; the collection was dropped since"
    return SourceRead(version, position, landing_table(rows.records), changed, None,
                      f"keys changed since {position} left out ({len(changed)} keys; {reason})", dropped=dropped)


#: How far the connector's clock, which stamps a read's processing time (``__ts_ms``), may run behind the
#: clock mongod takes cluster times from: a read stamped up to this long before the table's time is still
#: taken as one that may have been made after it (:func:`_read_late`).
CLOCK_SKEW_MS = 2000
_UNKNOWN_TIME = 2**63 - 1


def _read_late(at: Timestamp) -> Column:
    """Whether a fuzzy document (a changelog row, :func:`_fuzzy_document`) may have been read after cluster time ``at``,
    and so may show a write made after it: its processing time (``__ts_ms``, the connector's clock when it
    made the record, after the server answered the read) is at or after the start of ``at``'s second,
    less :data:`CLOCK_SKEW_MS`. A write after ``at`` takes a cluster time of ``at``'s second or later,
    from mongod's clock, and a read showing it came after it. Conservative at the boundary: the second's
    start (``at``'s milliseconds are unknown) and the skew take a read made up to about three seconds before
    ``at`` as late (a difference there is uncertain, counted against the coverage, never a false DIFFERS
    from a fuzzy read), and a read without a processing time is late; a read made earlier than that
    cannot show a later write, so a difference there is reported."""
    return F.coalesce(F.col("__ts_ms"), F.lit(_UNKNOWN_TIME)) >= F.lit(at.time * 1000 - CLOCK_SKEW_MS)


def _blocking_read() -> Column:
    return (F.col("__op") == "r") & ~F.coalesce(F.col("snapshot") == "incremental", F.lit(False))


def _fuzzy_document() -> Column:
    """A changelog row whose document may show writes made after its position: a blocking snapshot's
    read, or an update's full document, which the change stream looks up when it reads the event
    (``updateLookup``: the document as it is then, not as the update left it)."""
    return _blocking_read() | ((F.col("__op") == "u") & F.col("after").isNotNull())


def _signature(frame: DataFrame, names: list[str]) -> Column:
    """One comparable string of the columns a user reads (variants as their JSON)."""
    types = dict(frame.dtypes)
    parts = [F.to_json(F.col(typed_columns.quote(n))) if types[n] == "variant" else F.col(typed_columns.quote(n)) for n in names]
    return F.sha2(F.to_json(F.struct(*[p.alias(f"c{i}") for i, p in enumerate(parts)])), 256)


def _readable(key: Column) -> Column:
    return typed_columns.key_text(key)


def _per_key(spark: SparkSession, namespace: str, table: DataFrame, layout: Layout, source: DataFrame,
             log: DataFrame, snapshot: str | None, read: SourceRead, names: list[str]) -> DataFrame:
    """One row per key of the table, the source or the changelog, with what both comparisons need: one
    aggregation over the union of the three (and the keys changed since), no join.

    ``t``/``s``: the signature of the table's live row and of the source's; ``mt``/``ms``: the metadata
    the table shows and the winning event's (the key's latest event with a full document or a delete;
    pending keys and, dropping deletes, deleted ones have none); ``left_out``: changed since the table's
    time and not verifiable (:class:`SourceRead`); ``compared``/``mismatch`` from those."""
    live = ~F.col("__deleted") if layout.delete_handling == "rewrite" else F.lit(True)
    meta = ["__position", *[c for c in layout.metadata_columns if c != "__collection"]]
    wrong = F.col("__collection") != namespace if "__collection" in table.columns else F.lit(False)
    order = F.struct(F.col("__position"), F.when(F.col("__op") == "r", 0).otherwise(1))
    late = _fuzzy_document() & _read_late(read.fuzzy_at) if read.fuzzy_at is not None else F.lit(False)
    parts = [
        table.select("__key", F.when(live, _signature(table, names)).alias("t"), F.to_json(F.struct(*meta)).alias("mt"),
                     wrong.alias("wrong"), live.cast("int").alias("live"), F.lit(1).alias("rows")),
        source.select("__key", _signature(source, names).alias("s")),
        log.select("__key", F.struct("__op", "__position", "__source_ts_ms", late.alias("late")).alias("event"),
                   order.alias("order"), ((F.col("__op") == "d") | F.col("after").isNotNull()).alias("full")),
    ]
    if read.changed:
        keys = spark.createDataFrame([(k,) for k in sorted(read.changed)], T.StructType([T.StructField("__key", T.StringType())]))
        parts.append(keys.select("__key", F.lit(True).alias("changed")))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part, allowMissingColumns=True)
    per_key = union.groupBy("__key").agg(
        F.max("t").alias("t"), F.max("s").alias("s"), F.max("mt").alias("mt"), F.max("wrong").alias("wrong"),
        F.sum("live").alias("live"), F.sum("rows").alias("rows"),
        F.max_by("event", "order").alias("w"),  # rows of the table and the source have no order: not counted
        F.max(F.when(F.col("full"), True)).alias("based"),
        (F.max("changed") if read.changed else F.lit(False)).alias("changed"),
    )
    ghost = F.col("w.__position") < F.lit(snapshot) if snapshot is not None else F.lit(False)
    deleted = (F.col("w.__op") == "d") | ghost
    expected = {"__position": F.col("w.__position"), "__op": F.col("w.__op"),
                "__source_ts_ms": F.col("w.__source_ts_ms"), "__deleted": deleted}
    shown = F.col("based").isNotNull() & (F.lit(layout.delete_handling == "rewrite") | ~deleted)
    ms = F.when(shown, F.to_json(F.struct(*[expected[c].alias(c) for c in meta])))
    data_key = F.col("t").isNotNull() | F.col("s").isNotNull()
    differs = ~F.col("t").eqNullSafe(F.col("s"))
    changed = F.coalesce(F.col("changed"), F.lit(False))
    if read.fuzzy_at is not None:  # a key the table holds as a late read, or lacks, and that differs
        lacks = F.col("w").isNull() if read.copy_late else F.lit(False)
        changed = changed & (F.coalesce(F.col("w.late"), F.lit(False)) | lacks) & differs
    left_out = data_key & changed
    compared = data_key & ~left_out
    mismatch = ((compared & differs) | ~F.col("mt").eqNullSafe(ms) | F.coalesce(F.col("wrong"), F.lit(False))
                | (F.coalesce(F.col("rows"), F.lit(0)) > 1))
    return per_key.select("__key", F.coalesce(F.col("live"), F.lit(0)).alias("live"), left_out.alias("left_out"),
                          compared.alias("compared"), mismatch.alias("mismatch"))


def compare(spark: SparkSession, namespace: str, changelog: str, state: str, cfg: ConnectorConfig,
            source: SourceRead | None = None) -> Comparison:
    """Both comparisons of the module doc for one collection: one Spark job to find the table's time (unless
    ``source``, a :func:`read_source` for the changelog version and position the table holds, read it
    already; another is read now) and one aggregation that gives every count; the mismatching keys are
    collected only where there are some. Small tables are planned without adaptive execution or broadcasts
    (current_state's small plans: each is a Spark job of its own)."""
    found = look(spark, state)
    if found.version < 0:
        raise TableInputError(f"{namespace}: no current_state table at {state}: refresh it first")
    props = found.properties
    if KINDS_PROPERTY not in props:
        raise TableInputError(f"{namespace}: {state} was not written by mongocdc (no {KINDS_PROPERTY} property)")
    shape, layout = Shape.from_json(props[KINDS_PROPERTY]), _layout(props)
    position, version = props.get(POSITION_PROPERTY), int(props[VERSION_PROPERTY])
    table = spark.read.format("delta").load(state)
    log = spark.read.format("delta").option("versionAsOf", version).load(changelog)
    early = source is not None and source.holds(version, position)
    read = source if source is not None and early else _read(cfg, namespace, version, position, log)

    events = changelog_rows(spark.createDataFrame(read.rows), F.lit("reconciliation"), namespace)
    doc = typed_columns.document(F.col("after"))
    state_columns = {c: F.col(c) for c in ("__position", "__op", "__source_ts_ms")} | {"__deleted": F.lit(False)}
    rows = events.select(*columns(shape, layout, namespace, doc, F.col("__key"), state_columns, strict=False))
    names = ["_id", *[f.column for f in shape.user_columns()], "__doc"]
    nbytes = found.size_bytes + (size_at(spark, changelog, version) or 0) + read.rows.nbytes
    with sized_shuffles(spark, nbytes), _small_plans(spark, nbytes <= _SMALL_TABLE_BYTES), interpreted(spark, nbytes):
        per_key = _per_key(spark, namespace, table, layout, rows, log, props.get(SNAPSHOT_PROPERTY), read, names)
        figures = per_key.agg(
            F.sum("live").alias("table_rows"), F.count_if("left_out").alias("excluded"),
            F.count_if("compared").alias("compared"), F.count_if("mismatch").alias("mismatches"),
        ).first()
        assert figures is not None  # a global aggregation has one row
        mismatching: list[str] = []
        if figures["mismatches"]:
            found_keys = per_key.where("mismatch").select(_readable(F.col("__key")).alias("id"))
            mismatching = [r["id"] for r in found_keys.orderBy("id").limit(MAX_REPORTED_KEYS).collect()]
    return Comparison(
        position=position,
        method=read.method + ("; read right after the changelog's refresh" if early else ""),
        table_rows=int(figures["table_rows"] or 0),
        source_rows=read.rows.num_rows,
        keys_excluded=int(figures["excluded"]),
        keys_compared=int(figures["compared"]),
        mismatching_keys=mismatching,
        read_early=early,
        dropped=read.dropped,
    )
