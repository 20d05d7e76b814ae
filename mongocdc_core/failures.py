"""``event.processing.failure.handling.mode``: what happens to an event that cannot be processed or delivered.

Debezium's three modes: ``fail`` stops the connector with an error that names the event (collection,
key, position) and how to get past it; ``warn`` logs the event and skips it; ``skip`` skips it
quietly (a debug log line). Either way the event is counted (``NumberOfErroneousEvents``), so a
poison pill can never turn into a loop of identical crashes without the user choosing ``fail``,
and even then the error says what to change.

Two kinds of failure reach the policy, both from the dispatcher: an event the converter cannot turn
into records (``process``), and a record the sink refuses for what it is, for example larger than
the topic accepts (``deliver``, a :class:`~mongocdc_core.sinks.base.RecordRejected`). Failures of the
place itself (a broker away, a full disk) are not events' faults and never reach it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.positions import Position
from mongocdc_core.quoting import QUOTE_LIMIT, TEXT_LIMIT, bounded, quote

log = logging.getLogger("mongocdc.failures")

PROPERTY = "event.processing.failure.handling.mode"


SNAPSHOT_READ = "snapshot read"
CHANGE_EVENT = "change event"


class EventProcessingError(RuntimeError):
    """An event could not be processed or delivered and the mode is ``fail`` (exit code 8)."""


@dataclass(frozen=True)
class FailedEvent:
    """Which event failed: enough for a user to find it in MongoDB and in the stream."""

    action: str  # "process" (conversion) or "deliver" (the sink refused its record)
    kind: str  # "change event", "snapshot read", "notification", ...
    namespace: str | None
    key: str | None  # the document key, already quoted
    position: Position | None
    cause: str

    def describe(self) -> str:
        where = f" of {self.namespace}" if self.namespace else ""
        key = f" with key {self.key}" if self.key is not None else ""
        at = ""
        if self.position is not None:
            p = self.position
            at = f" at position {p.seconds}.{p.increment}.{p.ordinal} (clusterTime Timestamp({p.seconds}, {p.increment}))"
        return f"cannot {self.action} the {self.kind}{where}{key}{at}: {bounded(self.cause, TEXT_LIMIT)}"


def quote_key(value: object) -> str:
    """A document key or a record key as a message shows it (bounded)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return quote(value, QUOTE_LIMIT)


class FailurePolicy:
    """Applies ``event.processing.failure.handling.mode`` to one failed event."""

    def __init__(self, mode: str, metrics: ConnectorMetrics) -> None:
        if mode not in ("fail", "warn", "skip"):
            raise ValueError(f"{PROPERTY} must be fail, warn or skip, got {mode!r}")
        self.mode = mode
        self.metrics = metrics

    def failed(self, event: FailedEvent) -> None:
        """Raise ``EventProcessingError`` in ``fail`` mode; otherwise count the event and log it."""
        context = self.metrics.snapshot if event.kind == SNAPSHOT_READ else self.metrics.streaming
        context.erroneous()
        text = event.describe()
        if self.mode == "fail":
            raise EventProcessingError(
                f"{text}. The connector stops ({PROPERTY}=fail) and its offset stays before this event, so a "
                f"restart stops here again. To get past it, fix the cause or set {PROPERTY}=warn (log and skip "
                "events that cannot be processed or delivered) or skip (skip them quietly)."
            )
        if self.mode == "warn":
            log.warning("skipping an event (%s=warn): %s", PROPERTY, text)
        else:
            log.debug("skipping an event (%s=skip): %s", PROPERTY, text)
