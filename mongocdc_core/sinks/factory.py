"""Turns a ``--sink`` specification (``jsonl:DIR``, ``parquet:DIR``, ``kafka:HOST:PORT``) into a sink."""

from __future__ import annotations

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.sinks.base import Sink

SINK_FORMS = "jsonl:DIR, parquet:DIR or kafka:HOST:PORT"


def open_sink(spec: str, cfg: ConnectorConfig | None = None) -> Sink:
    """Open the sink named by ``spec``; ``cfg`` (a ConnectorConfig) carries sink pass-through settings."""
    kind, sep, target = spec.partition(":")
    if not sep or not target:
        raise ValueError(f"sink {spec!r} is not of the form {SINK_FORMS}")
    if kind == "jsonl":
        from mongocdc_core.sinks.jsonl import JsonlSink

        return JsonlSink(target, compression=cfg.mongocdc_jsonl_compression if cfg is not None else "none")
    if kind == "parquet":
        from mongocdc_core.sinks.parquet import ParquetSink

        return ParquetSink(target)
    if kind == "kafka":
        from mongocdc_core.sinks.kafka import KafkaSink

        return KafkaSink.from_config(target, cfg)
    raise ValueError(f"unknown sink kind {kind!r} in {spec!r}; expected {SINK_FORMS}")
