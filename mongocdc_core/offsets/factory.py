"""Turns an ``--offsets`` specification into an offset store.

Forms: ``PATH`` or ``file:PATH`` (the default file store) and ``kafka:HOST:PORT[,HOST:PORT…][/TOPIC]``
(a compacted topic, default ``mongocdc-offsets``, key = connector name). With
``mongocdc.kafka.exactly.once=true`` the Kafka store must be given the Kafka sink (same cluster):
offsets are then committed in the sink's transactions.
"""

from __future__ import annotations

from typing import Any

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.offsets.file import FileOffsetStore
from mongocdc_core.offsets.model import OffsetStore

OFFSET_FORMS = "PATH, file:PATH or kafka:HOST:PORT[/TOPIC]"


def open_offset_store(spec: str, cfg: ConnectorConfig | None = None, sink: Any = None) -> OffsetStore:
    """Open the store named by ``spec``; ``sink`` is the run's sink (needed for exactly-once)."""
    from mongocdc_core.sinks.kafka import KafkaSink

    if not spec:
        raise ValueError(f"empty offset store; expected {OFFSET_FORMS}")
    transactional = isinstance(sink, KafkaSink) and sink.transactional
    if spec.startswith("kafka:"):
        from mongocdc_core.offsets.kafka import kafka_offset_store, parse_kafka_spec

        target = spec.removeprefix("kafka:")
        if transactional:
            bootstrap, _ = parse_kafka_spec(target)
            if bootstrap != sink.settings.bootstrap_servers:
                raise ValueError(
                    f"mongocdc.kafka.exactly.once=true needs the offsets topic on the sink's cluster: "
                    f"--offsets {spec} but --sink kafka:{sink.settings.bootstrap_servers}"
                )
        return kafka_offset_store(target, cfg, sink if transactional else None)
    if transactional:
        raise ValueError(
            f"mongocdc.kafka.exactly.once=true commits offsets in Kafka transactions: use --offsets "
            f"kafka:{sink.settings.bootstrap_servers}/TOPIC instead of {spec!r}"
        )
    kind, sep, _ = spec.partition(":")
    if sep and kind != "file" and kind.isalpha() and len(kind) > 1:  # a path may contain ':' too
        raise ValueError(f"unknown offset store kind {kind!r} in {spec!r}; expected {OFFSET_FORMS}")
    return FileOffsetStore(spec.removeprefix("file:"))
