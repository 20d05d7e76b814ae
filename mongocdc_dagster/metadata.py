"""Metadata values the assets share: positions a person can read, Debezium metrics, table schemas."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from dagster import MetadataValue, TableColumn, TableSchema

from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.positions import Position

#: Debezium metric attributes shown on materialisations (the rest stay in the JSON/Prometheus exporters).
SNAPSHOT_METRICS = ("TotalNumberOfEventsSeen", "RowsScanned", "SnapshotDurationInSeconds", "SnapshotCompleted",
                    "SnapshotAborted", "NumberOfDisconnects")
STREAMING_METRICS = ("TotalNumberOfEventsSeen", "TotalNumberOfCreateEventsSeen", "TotalNumberOfUpdateEventsSeen",
                     "TotalNumberOfDeleteEventsSeen", "NumberOfEventsFiltered", "NumberOfCommittedTransactions",
                     "MilliSecondsBehindSource", "NumberOfDisconnects", "NumberOfPrimaryElections", "LastEvent")


def position_time(position: Position | str | None) -> str | None:
    """``2026-05-01T10:00:03Z (clusterTime 1777629603.4, ordinal 0)``: the cluster time in UTC, then exact."""
    if position is None:
        return None
    pos = Position.parse(position) if isinstance(position, str) else position
    when = datetime.fromtimestamp(pos.seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{when} (clusterTime {pos.seconds}.{pos.increment}, ordinal {pos.ordinal})"


def position_metadata(name: str, position: Position | str | None) -> dict[str, Any]:
    """A position as two entries: readable (``<name>``) and exact (``<name>_raw``, sortable text)."""
    if position is None:
        return {name: None}
    pos = Position.parse(position) if isinstance(position, str) else position
    return {name: position_time(pos), f"{name}_raw": pos.to_str()}


def metrics_metadata(metrics: ConnectorMetrics, contexts: tuple[str, ...]) -> dict[str, Any]:
    """Debezium's connector metrics of a call, as ``debezium/<context>/<Attribute>`` entries."""
    values = metrics.contexts()
    wanted = {"snapshot": SNAPSHOT_METRICS, "streaming": STREAMING_METRICS}
    out: dict[str, Any] = {}
    for context in contexts:
        for name in wanted[context]:
            value = values[context].get(name)
            if isinstance(value, Mapping):
                value = MetadataValue.json(dict(value))
            out[f"debezium/{context}/{name}"] = value
    return out


def spark_schema(schema: Any) -> TableSchema:
    """A Spark StructType as Dagster's column schema."""
    return TableSchema(columns=[TableColumn(f.name, f.dataType.simpleString()) for f in schema.fields])
