"""Engine progress -> the Dagster run log, throttled so a large copy logs a line every few seconds."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.positions import Position


class RunLogProgress(ProgressListener):
    """Writes snapshot and streaming progress to a run's log (called from engine threads)."""

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger], every_s: float = 5.0) -> None:
        self.log = log
        self.every_s = every_s
        self._last = 0.0
        self._lock = threading.Lock()

    def _due(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.every_s:
                return False
            self._last = now
            return True

    def snapshot_started(self, totals: Mapping[str, int | None]) -> None:
        for namespace, total in totals.items():
            self.log.info(f"snapshot of {namespace} started (about {total if total is not None else '?'} documents)")

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        if self._due():
            self.log.info(f"snapshot of {namespace}: {copied} of {total if total is not None else '?'} documents")

    def snapshot_collection_done(self, namespace: str, copied: int) -> None:
        self.log.info(f"snapshot of {namespace} copied {copied} documents")

    def streaming_started(self, position: Position | None) -> None:
        self.log.info(f"streaming from {position if position is not None else 'now'}")

    def streaming_progress(self, events: int, counts: Mapping[str, int], position: Position | None) -> None:
        if self._due():
            self.log.info(f"stream slice: {events} events {dict(counts)} up to {position}")
