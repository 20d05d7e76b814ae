"""Landing files made by the real converter and sink, and ways to read the tables back for assertions."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import VariantVal

from mongocdc_core.positions import Position
from mongocdc_core.tables import (
    CollectionTables,
    TableOptions,
    read_current_state,
    refresh_changelog,
    refresh_current_state,
)
from mongocdc_core.tables.typed_columns import quote

from .workload import converter, write_landing


def read_file(path: Path, db: str, coll: str, docs: Sequence[dict[str, Any]], position: Position,
              capture_mode: str = "change_streams_update_full") -> Path:
    """A landing file of snapshot reads of ``docs`` at ``position``."""
    conv = converter(capture_mode)
    return write_landing(path, [conv.convert_read(d, db, coll, position, "true") for d in docs])


def build(spark: SparkSession, tables: CollectionTables, *files: Path, **options: Any) -> DataFrame:
    """Refresh both tables from ``files`` and return current_state."""
    refresh_changelog(spark, tables, [str(f) for f in files])
    refresh_current_state(spark, tables, TableOptions(**options))
    return read_current_state(spark, tables.current_state)


def comparable(frame: DataFrame, drop: Sequence[str] = ()) -> list[tuple[Any, ...]]:
    """The column names, then every row as plain values (variants as JSON, NaN as a string), sorted
    by ``__key``. Columns come in name order: a table's column order is the order its kinds were
    discovered (new ones are appended, as Delta's schema evolution does), which depends on how the
    events were batched, not on what they contain."""
    types = dict(frame.dtypes)
    names = sorted(c for c in frame.columns if c not in drop)
    shown = frame.select(*[
        (F.to_json(F.col(quote(c))) if types[c] == "variant" else F.col(quote(c))).alias(f"c{i}")
        for i, c in enumerate(names)
    ])
    key = names.index("__key") if "__key" in names else 0

    def plain(value: Any) -> Any:
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        if isinstance(value, VariantVal):  # inside arrays and structs (top-level variants are JSON already)
            return value.toJson()
        if hasattr(value, "asDict"):
            return tuple(plain(v) for v in value)
        if isinstance(value, list):
            return tuple(plain(v) for v in value)
        return value

    rows = sorted((tuple(plain(v) for v in row) for row in shown.collect()), key=lambda r: str(r[key]))
    return [tuple(names), *rows]
