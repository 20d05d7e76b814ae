"""Reading and validating landing-zone Parquet files (what the asset checks assert about them).

A record is valid when it is a Debezium change event envelope the seeds describe: a key payload
`{"id": ...}`, a value whose `op` matches the row, a `source` block naming the row's collection, and a
position inside the bounds the partition promises. Tombstones (null value) must follow a delete.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq

from mongocdc_core.positions import Position

_OPS = frozenset({"c", "u", "d", "r"})
_SNAPSHOT_MARKERS = frozenset(
    {"true", "first", "last", "first_in_data_collection", "last_in_data_collection", "incremental"}
)
_STREAM_MARKERS = frozenset({"false"})
_COLUMNS = ["collection", "key", "op", "position", "snapshot", "value"]
MAX_REPORTED = 20


@dataclass(frozen=True)
class Expectation:
    """What every row of one partition's file must satisfy.

    `snapshot`: only reads (op r). `incremental`: reads plus the changes streamed while the chunks were
    copied, each with its own marker. Neither: only changes (a stream slice).
    """

    namespace: str
    snapshot: bool
    low: Position | None = None  # inclusive
    high: Position | None = None  # exclusive
    exact: Position | None = None  # snapshot reads all carry this position
    incremental: bool = False


def _rows(path: Path) -> Iterator[dict[str, Any]]:
    table = pq.read_table(path, columns=_COLUMNS)
    yield from table.to_pylist()


def _json(text: str | None, what: str) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None


def _row_problem(row: dict[str, Any], expect: Expectation, previous: dict[str, Any] | None) -> str | None:
    key = _json(row["key"], "key")
    if not isinstance(key, dict) or set(key) != {"id"} or not isinstance(key["id"], str):
        return f"key {row['key']!r} is not a Debezium key payload {{\"id\": \"...\"}}"
    try:
        position = Position.parse(row["position"])
    except (ValueError, TypeError) as exc:
        return str(exc)
    if expect.exact is not None and position != expect.exact:
        return f"position {position} differs from the snapshot position {expect.exact}"
    if expect.low is not None and position < expect.low:
        return f"position {position} is before the window start {expect.low}"
    if expect.high is not None and position >= expect.high:
        return f"position {position} is at or after the window end {expect.high}"
    op = row["op"]
    if op is None:
        if row["value"] is not None:
            return "a row without op carries a value (only tombstones may lack op)"
        if previous is None or previous["op"] != "d" or previous["key"] != row["key"]:
            return "tombstone does not follow a delete of the same key"
        return None
    if op not in _OPS:
        return f"op {op!r} is not one of c, u, d, r"
    if expect.snapshot and not expect.incremental and op != "r":
        return f"snapshot record has op {op!r}, expected 'r'"
    if not expect.snapshot and op == "r":
        return "stream slice record has op 'r' (reads belong to snapshots)"
    if row["collection"] != expect.namespace:
        return f"collection {row['collection']!r} is not the partition's {expect.namespace!r}"
    value = _json(row["value"], "value")
    if not isinstance(value, dict):
        return "value is not a JSON object"
    if value.get("op") != op:
        return f"value op {value.get('op')!r} differs from the row's {op!r}"
    source = value.get("source")
    if not isinstance(source, dict):
        return "value has no source block"
    if f"{source.get('db')}.{source.get('collection')}" != expect.namespace:
        return f"source names {source.get('db')}.{source.get('collection')}, not {expect.namespace}"
    if not isinstance(value.get("ts_ms"), int):
        return "value has no integer ts_ms"
    markers = _SNAPSHOT_MARKERS if op == "r" else _STREAM_MARKERS
    if str(source.get("snapshot", "false")).lower() not in markers:
        return f"source.snapshot {source.get('snapshot')!r} is wrong for an {op!r} record"
    if op in ("c", "r") and not isinstance(value.get("after"), str):
        return f"{op!r} record has no 'after' document (a JSON string)"
    if op == "d" and value.get("after") is not None:
        return "delete record carries an 'after' document"
    return None


@dataclass(frozen=True)
class EnvelopeReport:
    """The outcome of validating one file."""

    rows: int
    reads: int
    invalid: int
    problems: list[str]

    @property
    def passed(self) -> bool:
        return self.invalid == 0


def validate_file(path: Path, expect: Expectation) -> EnvelopeReport:
    """Validate every row of a landing file; list the first problems with their row numbers."""
    rows = reads = invalid = 0
    problems: list[str] = []
    previous: dict[str, Any] | None = None
    for index, row in enumerate(_rows(path)):
        rows += 1
        reads += row["op"] == "r"
        try:
            problem = _row_problem(row, expect, previous)
        except ValueError as exc:
            problem = str(exc)
        if problem is not None:
            invalid += 1
            if len(problems) < MAX_REPORTED:
                problems.append(f"row {index}: {problem}")
        previous = row
    return EnvelopeReport(rows, reads, invalid, problems)


def count_rows_at(path: Path, position: Position) -> int:
    """Read records in a snapshot file that carry exactly `position` (the snapshot's own reads)."""
    table = pq.read_table(path, columns=["op", "position"])
    wanted = position.to_str()
    return sum(1 for op, pos in zip(table["op"].to_pylist(), table["position"].to_pylist(), strict=True)
               if op == "r" and pos == wanted)


def live_keys(path: Path) -> int:
    """Keys whose highest-position record is not a delete: the collection's size the file implies."""
    table = pq.read_table(path, columns=["key", "op", "position"])
    latest: dict[str, tuple[str, str]] = {}
    for key, op, position in zip(table["key"].to_pylist(), table["op"].to_pylist(), table["position"].to_pylist(),
                                 strict=True):
        if op is None:
            continue  # tombstones repeat the delete before them
        if key not in latest or position >= latest[key][0]:
            latest[key] = (position, op)
    return sum(1 for _, op in latest.values() if op != "d")
