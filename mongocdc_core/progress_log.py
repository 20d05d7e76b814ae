"""Engine progress as log lines: "N of M documents, r/s, ETA", a line every few seconds.

Where no progress bar can be drawn: a Dagster run's log, and ``mongocdc run`` when stderr is not a terminal.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

from mongocdc_core.positions import Position
from mongocdc_core.receiver import ProgressListener, duration


def progress_line(namespace: str, copied: int, total: int | None, elapsed_s: float) -> str:
    """``snapshot of ns: 12000 of 50000 documents (24%), 3000/s, ETA 13 s`` (without a total: no ETA)."""
    rate = copied / elapsed_s if elapsed_s > 0 else 0.0
    if total:
        shown_total = max(total, copied)  # the total is an estimate; never show more copied than total
        eta = (shown_total - copied) / rate if rate > 0 else None
        return (f"snapshot of {namespace}: {copied} of {shown_total} documents ({100 * copied // shown_total}%), "
                f"{rate:,.0f}/s, ETA {duration(eta) if eta is not None else 'unknown'}")
    return f"snapshot of {namespace}: {copied} documents, {rate:,.0f}/s"


class LogProgress(ProgressListener):
    """Writes snapshot and streaming progress to a log (called from engine threads).

    ``totals`` are the collections' estimated sizes (the engine may not know them for a single
    collection's snapshot); ``every_s`` throttles the lines.
    """

    def __init__(self, log: logging.Logger | logging.LoggerAdapter[logging.Logger],
                 totals: Mapping[str, int | None] | None = None, every_s: float = 5.0) -> None:
        self.log = log
        self.every_s = every_s
        self.totals: dict[str, int | None] = dict(totals or {})
        self._started: dict[str, float] = {}
        self._last = 0.0
        self._lock = threading.Lock()

    def _due(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self.every_s:
                return False
            self._last = now
            return True

    def _elapsed(self, namespace: str) -> float:
        return time.monotonic() - self._started.setdefault(namespace, time.monotonic())

    def snapshot_started(self, totals: Mapping[str, int | None]) -> None:
        for namespace, total in totals.items():
            if total is not None:
                self.totals[namespace] = total
            self._started[namespace] = time.monotonic()
            known = self.totals.get(namespace)
            self.log.info(f"snapshot of {namespace} started (about {known if known is not None else '?'} documents)")

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        if self._due():
            self.log.info(progress_line(namespace, copied, total or self.totals.get(namespace), self._elapsed(namespace)))

    def snapshot_collection_done(self, namespace: str, copied: int) -> None:
        elapsed = self._elapsed(namespace)
        self.log.info(f"snapshot of {namespace} copied {copied} documents in {duration(elapsed)} "
                      f"({copied / elapsed if elapsed > 0 else 0:,.0f}/s)")

    def snapshot_finished(self, completed: bool, documents: int) -> None:
        self.log.info(f"snapshot {'completed' if completed else 'stopped'}: {documents} documents")

    def streaming_started(self, position: Position | None) -> None:
        self.log.info(f"streaming from {position if position is not None else 'now'}")

    def streaming_progress(self, events: int, counts: Mapping[str, int], position: Position | None) -> None:
        if self._due():
            self.log.info(f"stream: {events} events {dict(counts)} up to {position}")
