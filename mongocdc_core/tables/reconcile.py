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
   out and counted too (equal, it is verified). A read made before the table's time, and a key a change
   event wrote, are exact at its position: a difference there is one.
2. **The metadata columns** (``__position``, ``__op``, ``__source_ts_ms``, ``__deleted``) against the
   winning event of each key in the changelog version the table reflects.

Every comparison says how much it verified: the keys compared of all keys of both sides (the keys left
out are not verified). A comparison that verified less than ``min_coverage`` of them is no pass, even
with no difference found: where every key changed since the table's position, it compared nothing.

MongoDB is read only through :mod:`mongocdc_core.api`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import orjson
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
    table_exists,
    table_properties,
)
from mongocdc_core.tables.current_state import (
    KINDS_PROPERTY,
    OPTIONS_PROPERTY,
    VERSION_PROPERTY,
    Layout,
    Shape,
    columns,
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


def _reflected_time(log: DataFrame, position: str) -> tuple[Timestamp, str]:
    """The cluster time whose state a table at ``position`` holds, and how to say it.

    After a change event at ``position`` it is that event's clusterTime: every event up to it was
    applied. When only a blocking snapshot's reads are at ``position`` it is the tick before: a
    snapshot's position is where its change stream starts, mongod's latest operation time plus one
    tick, so the next write takes that very time; its reads hold the state before it, and a write at
    that time comes from the stream (sorted after the reads). Incremental snapshot reads take the
    position of their close watermark, an event that came after the state they hold."""
    at = Position.parse(position).timestamp
    event = log.where(
        (F.col("__position") == position)
        & ((F.col("__op") != "r") | F.coalesce(F.col("snapshot") == "incremental", F.lit(False)))
    )
    if event.limit(1).count():
        return at, f"{at.time}.{at.inc}"
    before = Timestamp(at.time, at.inc - 1) if at.inc else Timestamp(at.time - 1, 0xFFFFFFFF)
    return before, f"{before.time}.{before.inc} (the tick before the snapshot's position {at.time}.{at.inc}, where its stream starts)"


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
class _Left:
    """Keys changed since the table's time, to leave out of the comparison. ``fuzzy_at`` (the table's time,
    where the source was read at it): only those a blocking snapshot's copy may have read after that time,
    where they differ from the source at that time."""

    changed: set[str]
    fuzzy_at: Timestamp | None


def _source(cfg: ConnectorConfig, namespace: str, position: str | None, log: DataFrame) -> tuple[_Rows, _Left, str]:
    """The collection at ``position``: its read rows, the keys to leave out, and how it was read."""
    rows = _Rows()
    if position is None:
        api.snapshot_collection(cfg, namespace, rows, filter={})
        return rows, _Left(set(), fuzzy_at=None), "read now (the table has no position yet)"
    at, said = _reflected_time(log, position)
    try:
        api.snapshot_collection(cfg, namespace, rows, filter={}, at_cluster_time=at)
    except api.SnapshotReadUnavailable as exc:
        reason = str(exc)
    else:
        changed = _changed_since(cfg, namespace, at) if _copy_read_late(log, at) else set()
        return rows, _Left(changed, fuzzy_at=at), f"snapshot read at {said}" + (
            "; keys changed since that differ where the table holds them as a blocking snapshot's copy read them "
            "after that time, or lacks them while the copy read after it, left out (the copy may have read them "
            "after that time)" if changed else "")
    rows = _Rows()
    api.snapshot_collection(cfg, namespace, rows, filter={})
    # changed since: every event after the time the table holds (the snapshot's own position included)
    changed = _changed_since(cfg, namespace, at)
    return rows, _Left(changed, fuzzy_at=None), f"keys changed since {position} left out ({len(changed)} keys; {reason})"


#: How far the connector's clock, which stamps a read's processing time (``__ts_ms``), may run behind the
#: clock mongod takes cluster times from: a read stamped up to this long before the table's time is still
#: taken as one that may have been made after it (:func:`_read_late`).
CLOCK_SKEW_MS = 2000
_UNKNOWN_TIME = 2**63 - 1


def _read_late(at: Timestamp) -> Column:
    """Whether a blocking snapshot's read (a changelog row) may have been made after cluster time ``at``,
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


def _late_blocking_reads(log: DataFrame, at: Timestamp) -> DataFrame:
    """The keys whose winning event in ``log`` is a blocking snapshot's read made late (:func:`_read_late`)."""
    order = F.struct(F.col("__position"), F.when(F.col("__op") == "r", 0).otherwise(1))
    winners = log.groupBy("__key").agg(F.max_by(_blocking_read() & _read_late(at), order).alias("late"))
    return winners.where(F.col("late")).select("__key")


def _uncertain(log: DataFrame, changed: DataFrame, at: Timestamp) -> DataFrame:
    """Of the keys ``changed`` since the table's time ``at`` (``__key``), those a fuzzy copy may have read
    after it: the table holds them as a blocking snapshot's read made late, or lacks them (a copy may miss
    a key deleted before it came to it; only asked where the copy's newest read was late,
    :func:`_copy_read_late`). A key a change event wrote, or a read made before ``at``, is exact at the
    table's position."""
    late = changed.join(_late_blocking_reads(log, at), "__key", "left_semi")
    return late.union(changed.join(log.select("__key").distinct(), "__key", "left_anti"))


def _copy_read_late(log: DataFrame, at: Timestamp) -> bool:
    """Whether any blocking snapshot's read in ``log`` was made late (:func:`_read_late`): the newest read's
    processing time. Where none was, no key is uncertain (no key changed since is asked for)."""
    return bool(log.where(_blocking_read() & _read_late(at)).limit(1).count())


def _signature(frame: DataFrame, names: list[str]) -> Column:
    """One comparable string of the columns a user reads (variants as their JSON)."""
    types = dict(frame.dtypes)
    parts = [F.to_json(F.col(typed_columns.quote(n))) if types[n] == "variant" else F.col(typed_columns.quote(n)) for n in names]
    return F.sha2(F.to_json(F.struct(*[p.alias(f"c{i}") for i, p in enumerate(parts)])), 256)


def _readable(key: Column) -> Column:
    return typed_columns.key_text(key)


def _state_winners(changelog: DataFrame, snapshot: str | None, rewrite: bool) -> DataFrame:
    """Per key, the winning event's metadata as the table should show it (pending keys left out)."""
    order = F.struct(F.col("__position"), F.when(F.col("__op") == "r", 0).otherwise(1))
    full = (F.col("__op") == "d") | F.col("after").isNotNull()
    per_key = changelog.groupBy("__key").agg(
        F.max_by(F.struct("__op", "__position", "__source_ts_ms"), order).alias("w"),
        F.max(F.when(full, 1)).alias("based"),
    ).where(F.col("based").isNotNull())
    ghost = F.lit(snapshot).isNotNull() & (F.col("w.__position") < F.lit(snapshot))
    deleted = (F.col("w.__op") == "d") | ghost
    winners = per_key.select(
        "__key", F.col("w.__op").alias("__op"), F.col("w.__position").alias("__position"),
        F.col("w.__source_ts_ms").alias("__source_ts_ms"), deleted.alias("__deleted"),
    )
    return winners if rewrite else winners.where(~F.col("__deleted"))


def compare(spark: SparkSession, namespace: str, changelog: str, state: str, cfg: ConnectorConfig) -> Comparison:
    """Both comparisons of the module doc for one collection."""
    if not table_exists(spark, state):
        raise TableInputError(f"{namespace}: no current_state table at {state}: refresh it first")
    props = table_properties(spark, state)
    if KINDS_PROPERTY not in props:
        raise TableInputError(f"{namespace}: {state} was not written by mongocdc (no {KINDS_PROPERTY} property)")
    shape, layout = Shape.from_json(props[KINDS_PROPERTY]), _layout(props)
    position = props.get(POSITION_PROPERTY)
    table = spark.read.format("delta").load(state)
    if layout.delete_handling == "rewrite":
        live = table.where(~F.col("__deleted"))
    else:
        live = table
    log = spark.read.format("delta").option("versionAsOf", int(props[VERSION_PROPERTY])).load(changelog)
    rows, excluded, method = _source(cfg, namespace, position, log)

    landing = spark.createDataFrame(landing_table(rows.records))
    events = changelog_rows(landing, F.lit("reconciliation"), namespace)
    doc = typed_columns.document(F.col("after"))
    state_columns = {c: F.col(c) for c in ("__position", "__op", "__source_ts_ms")} | {"__deleted": F.lit(False)}
    source = events.select(*columns(shape, layout, namespace, doc, F.col("__key"), state_columns, strict=False))
    names = ["_id", *[f.column for f in shape.user_columns()], "__doc"]
    left = live.select("__key", _signature(live, names).alias("t"))
    right = source.select("__key", _signature(source, names).alias("s"))
    joined = left.join(right, "__key", "full_outer")
    keys_excluded = 0
    if excluded.changed:
        leave_out = spark.createDataFrame([(k,) for k in excluded.changed],
                                          T.StructType([T.StructField("__key", T.StringType())]))
        if excluded.fuzzy_at is not None:  # of those, the ones that differ: a key equal to the source is verified
            differing = joined.where(~F.col("t").eqNullSafe(F.col("s")))
            leave_out = _uncertain(log, leave_out, excluded.fuzzy_at).join(differing, "__key", "left_semi")
        keys_excluded = leave_out.join(joined, "__key", "left_semi").count()
        joined = joined.join(leave_out, "__key", "left_anti")
    keys_compared = joined.count()
    data_mismatch = joined.where(~F.col("t").eqNullSafe(F.col("s"))).select("__key")

    expected = _state_winners(log, props.get(SNAPSHOT_PROPERTY), layout.delete_handling == "rewrite")
    meta = ["__position", *[c for c in layout.metadata_columns if c != "__collection"]]
    meta_left = table.select("__key", F.to_json(F.struct(*meta)).alias("t"))
    meta_right = expected.select("__key", F.to_json(F.struct(*meta)).alias("s"))
    meta_mismatch = meta_left.join(meta_right, "__key", "full_outer").where(~F.col("t").eqNullSafe(F.col("s")))
    wrong_collection = (
        table.where(F.col("__collection") != namespace).select("__key") if "__collection" in table.columns else None
    )
    mismatches = data_mismatch.union(meta_mismatch.select("__key"))
    if wrong_collection is not None:
        mismatches = mismatches.union(wrong_collection)
    found = mismatches.distinct().select(_readable(F.col("__key")).alias("id")).orderBy("id").limit(MAX_REPORTED_KEYS)
    return Comparison(
        position=position,
        method=method,
        table_rows=live.count(),
        source_rows=len(rows.records),
        keys_excluded=keys_excluded,
        keys_compared=keys_compared,
        mismatching_keys=[r["id"] for r in found.collect()],
    )
