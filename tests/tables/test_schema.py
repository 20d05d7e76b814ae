"""Schema evolution of current_state: new fields add columns, type conflicts widen and are reported."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from mongocdc_core.positions import Position
from mongocdc_core.tables import TableLocations, materialize, read_current_state

from .workload import DB, converter, write_landing


def _snapshot(tmp: Path, name: str, docs: list[dict[str, Any]], seconds: int) -> Path:
    conv = converter("change_streams_update_full")
    records = [conv.convert_read(d, DB, "shapes", Position(seconds, 1), "true") for d in docs]
    return write_landing(tmp / f"{name}.parquet", records)


def test_new_fields_add_columns_and_conflicts_widen(spark: SparkSession, tmp_path: Path) -> None:
    tables = TableLocations(str(tmp_path / "tables"))
    when = datetime.datetime(2024, 1, 2, 3, 4, 5)
    _, first = materialize(spark, tables, [_snapshot(tmp_path, "a", [
        {"_id": 1, "qty": 1, "when": when},
        {"_id": 2, "qty": 2, "price": 1.5},
    ], 100)])
    assert set(first.new_columns) == {"qty", "when", "price"} and not first.widened
    types = dict(read_current_state(spark, tables.current_state).dtypes)
    assert (types["qty"], types["when"], types["price"]) == ("bigint", "timestamp", "double")

    _, second = materialize(spark, tables, [_snapshot(tmp_path, "b", [
        {"_id": 3, "qty": "three", "tags": ["x"], "price": 2},
        {"_id": 4, "qty": 4.5, "nested": {"k": 1}},
    ], 200)])
    assert set(second.new_columns) == {"tags", "nested"}
    assert second.widened["qty"].endswith("-> string") and "price" not in second.widened
    state = read_current_state(spark, tables.current_state)
    types = dict(state.dtypes)
    assert (types["qty"], types["price"], types["tags"], types["nested"]) == ("string", "double", "string", "string")
    rows = {r["_id"]: r for r in state.collect()}
    assert [rows[k]["qty"] for k in ("1", "2", "3", "4")] == ["1", "2", "three", "4.5"]
    assert rows["1"]["when"] == when and rows["3"]["price"] == 2.0
    assert rows["3"]["tags"] == '["x"]' and rows["4"]["nested"] == '{"k": 1}'
    assert rows["2"]["tags"] is None
