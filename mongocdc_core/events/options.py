"""The connector options the event layer reads, decoupled from ``mongocdc_core.config``.

Keeping a small frozen copy of just these options lets the conversion layer be tested and
benchmarked alone; :meth:`EventOptions.from_config` reads them from a ``ConnectorConfig``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING

from mongocdc_core.events.naming import DEFAULT_STRATEGY, TopicNamingStrategy, TopicSettings, topic_naming

if TYPE_CHECKING:  # the event layer reads a config but never needs the config package at run time
    from mongocdc_core.config import ConnectorConfig

CAPTURE_MODES = (
    "change_streams",
    "change_streams_update_full",
    "change_streams_with_pre_image",
    "change_streams_update_full_with_pre_image",
)
ADJUSTMENT_MODES = ("none", "avro", "avro_unicode")
EVENT_FORMATS = ("change_streams", "oplog_1x", "debezium_3x")
SKIPPABLE_OPERATIONS = frozenset({"c", "u", "d", "t"})


def _package_version() -> str:
    try:
        return metadata.version("mongocdc")
    except metadata.PackageNotFoundError:
        return "0.0.0"


CONNECTOR_VERSION = _package_version()


@dataclass(frozen=True, slots=True)
class EventOptions:
    """What the conversion needs, with Debezium's defaults.

    ``rs`` is the replica set name written into ``source.rs`` (known from the topology, not the
    config); ``now_ns`` is the clock for the envelope's ``ts_ms/ts_us/ts_ns`` (fixed in tests).
    """

    topic_prefix: str
    topic_delimiter: str = "."
    topic_transaction: str = "transaction"
    topic_heartbeat_prefix: str = "__debezium-heartbeat"
    topic_naming_strategy: str = DEFAULT_STRATEGY
    capture_mode: str = "change_streams_update_full"
    tombstones_on_delete: bool = True
    skipped_operations: frozenset[str] = frozenset({"t"})
    field_exclude_list: tuple[str, ...] = ()
    field_renames: tuple[str, ...] = ()
    schema_name_adjustment_mode: str = "none"
    field_name_adjustment_mode: str = "none"
    provide_transaction_metadata: bool = False
    event_format: str = "change_streams"
    schemas_enable: bool = True
    rs: str = ""
    connector_version: str = CONNECTOR_VERSION
    now_ns: Callable[[], int] = field(default=time.time_ns, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.topic_prefix, str) or not self.topic_prefix:
            raise ValueError(f"topic.prefix must be a non-empty string, got {self.topic_prefix!r}")
        if self.capture_mode not in CAPTURE_MODES:
            raise ValueError(
                f"capture.mode must be one of {', '.join(CAPTURE_MODES)}; got {self.capture_mode!r}"
            )
        for prop, value in (
            ("schema.name.adjustment.mode", self.schema_name_adjustment_mode),
            ("field.name.adjustment.mode", self.field_name_adjustment_mode),
        ):
            if value not in ADJUSTMENT_MODES:
                raise ValueError(f"{prop} must be one of {', '.join(ADJUSTMENT_MODES)}; got {value!r}")
        if self.event_format not in EVENT_FORMATS:
            raise ValueError(
                f"mongocdc.event.format must be one of {', '.join(EVENT_FORMATS)}; got {self.event_format!r}"
            )
        unknown = set(self.skipped_operations) - SKIPPABLE_OPERATIONS - {"none"}
        if unknown:
            raise ValueError(
                f"skipped.operations accepts c, u, d, t or none; unknown: {', '.join(sorted(unknown))}"
            )
        topic_naming(self.topic_naming_strategy, self.topic_settings)  # an unknown strategy fails here
        object.__setattr__(self, "skipped_operations", frozenset(self.skipped_operations) - {"none"})
        object.__setattr__(self, "field_exclude_list", tuple(self.field_exclude_list))
        object.__setattr__(self, "field_renames", tuple(self.field_renames))

    @property
    def topic_settings(self) -> TopicSettings:
        """The ``topic.*`` options a naming strategy reads."""
        return TopicSettings(self.topic_prefix, self.topic_delimiter, self.topic_heartbeat_prefix, self.topic_transaction)

    def topics(self) -> TopicNamingStrategy:
        """The configured topic naming strategy (``topic.naming.strategy``)."""
        return topic_naming(self.topic_naming_strategy, self.topic_settings)

    @property
    def update_full(self) -> bool:
        """Whether update events carry ``after`` (the post-image or looked-up document)."""
        return "update_full" in self.capture_mode

    @property
    def pre_image(self) -> bool:
        """Whether update/replace/delete events carry ``before`` from the pre-image."""
        return self.capture_mode.endswith("with_pre_image")

    @classmethod
    def from_config(
        cls, cfg: ConnectorConfig, *, rs: str = "", now_ns: Callable[[], int] = time.time_ns
    ) -> EventOptions:
        """Read the options from a ``ConnectorConfig`` (property ``a.b.c`` is attribute ``a_b_c``)."""
        return cls(
            topic_prefix=cfg.topic_prefix,
            topic_delimiter=cfg.topic_delimiter,
            topic_transaction=cfg.topic_transaction,
            topic_heartbeat_prefix=cfg.topic_heartbeat_prefix,
            topic_naming_strategy=cfg.topic_naming_strategy,
            capture_mode=cfg.capture_mode,
            tombstones_on_delete=cfg.tombstones_on_delete,
            skipped_operations=frozenset(cfg.skipped_operations),
            field_exclude_list=tuple(cfg.field_exclude_list),
            field_renames=tuple(cfg.field_renames),
            schema_name_adjustment_mode=cfg.schema_name_adjustment_mode,
            field_name_adjustment_mode=cfg.field_name_adjustment_mode,
            provide_transaction_metadata=cfg.provide_transaction_metadata,
            event_format=cfg.mongocdc_event_format,
            schemas_enable=cfg.mongocdc_schemas_enable,
            rs=rs,
            now_ns=now_ns,
        )
