"""The envelope check catches each way a landing record can be wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mongocdc_core.positions import Position
from mongocdc_core.sinks.parquet import LANDING_SCHEMA
from mongocdc_dagster.landing_checks import Expectation, count_rows_at, live_keys, validate_file

NS = "inv.orders"
POS = Position(1_700_000_000, 3)


def _row(op: str | None = "c", position: Position = POS, **overrides: Any) -> dict[str, Any]:
    value = None if op is None else {
        "op": op, "ts_ms": 1, "after": None if op == "d" else '{"_id": 1}',
        "source": {"db": "inv", "collection": "orders", "snapshot": "true" if op == "r" else "false"}}
    row: dict[str, Any] = {name: None for name in LANDING_SCHEMA.names}
    row.update({"topic": f"srv.{NS}", "collection": NS, "key": '{"id":"1"}', "op": op, "position": position.to_str(),
                "value": None if value is None else orjson.dumps(value).decode()})
    row.update(overrides)
    return row


def _file(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=LANDING_SCHEMA), path)
    return path


def test_valid_stream_records_with_tombstone_pass(tmp_path: Path) -> None:
    path = _file(tmp_path, [_row("c"), _row("u"), _row("d"), _row(None)])
    report = validate_file(path, Expectation(NS, snapshot=False, low=POS, high=Position(POS.seconds + 1, 0)))
    assert report.passed and report.rows == 4


@pytest.mark.parametrize(("row", "expect", "message"), [
    (_row(key='{"_id":"1"}'), Expectation(NS, False), "not a Debezium key payload"),
    (_row(op="x"), Expectation(NS, False), "not one of c, u, d, r"),
    (_row("c"), Expectation(NS, True, exact=POS), "expected 'r'"),
    (_row("r"), Expectation(NS, False), "reads belong to snapshots"),
    (_row(collection="inv.other"), Expectation(NS, False), "not the partition's"),
    (_row(value='{"op":"u"}'), Expectation(NS, False), "differs from the row's"),
    (_row(None), Expectation(NS, False), "tombstone does not follow a delete"),
    (_row(), Expectation(NS, False, high=POS), "at or after the window end"),
    (_row(), Expectation(NS, False, low=Position(POS.seconds + 1, 0)), "before the window start"),
    (_row("r"), Expectation(NS, True, exact=Position(1, 1)), "differs from the snapshot position"),
    ({**_row(), "position": "garbage"}, Expectation(NS, False), "not a position"),
    (_row(value="{broken"), Expectation(NS, False), "value is not JSON"),
])
def test_each_defect_is_reported_with_its_row(tmp_path: Path, row: dict[str, Any], expect: Expectation,
                                               message: str) -> None:
    report = validate_file(_file(tmp_path, [row]), expect)
    assert not report.passed and report.invalid == 1
    assert report.problems[0].startswith("row 0:") and message in report.problems[0]


def test_count_rows_at_counts_only_reads_at_the_position(tmp_path: Path) -> None:
    rows = [_row("r"), _row("r"), _row("r", position=Position(POS.seconds + 5, 1)), _row("c")]
    assert count_rows_at(_file(tmp_path, rows), POS) == 2


def test_incremental_files_mix_reads_and_streamed_changes(tmp_path: Path) -> None:
    later = Position(POS.seconds + 1, 1)
    reads = [_row("r", key='{"id":"1"}'), _row("r", key='{"id":"2"}'), _row("r", key='{"id":"3"}')]
    changes = [_row("d", position=later, key='{"id":"2"}'), _row(None, position=later, key='{"id":"2"}'),
               _row("c", position=later, key='{"id":"9"}')]
    path = _file(tmp_path, reads + changes)
    assert validate_file(path, Expectation(NS, snapshot=True, incremental=True)).passed
    assert not validate_file(path, Expectation(NS, snapshot=True)).passed  # a blocking snapshot has only reads
    assert live_keys(path) == 3  # 1, 3 and 9: the delete of 2 has the higher position
