"""An emulated replica set whose cluster clock runs behind the wall clock and can be moved forward.

Stream slices are windows of cluster time; a test (or benchmark) that needs events in several closed
windows would otherwise wait minutes of wall time. Here the emulator's clock starts ``behind_s``
seconds in the past, so every window it writes into is already a Dagster partition, and ``jump``
moves it to the next window at once. Decided by positions, not by sleeping. Emulator only (a real
MongoDB keeps real time): tests using it are marked ``fault``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from bson import Timestamp

from mongocdc_devstack import mongod
from mongocdc_devstack.fixture import free_port
from mongocdc_devstack.mongod import EmulatorServer, ServerConfig
from mongocdc_devstack.oplog import ClusterClock


class TravelClock(ClusterClock):
    """mongod's logical clock (strictly increasing) over ``wall time - behind_s``."""

    def __init__(self, behind_s: float) -> None:
        super().__init__()
        self.behind_s = behind_s

    def now(self) -> datetime:
        return datetime.fromtimestamp(time.time() - self.behind_s, UTC)

    def next(self) -> Timestamp:
        now = int(time.time() - self.behind_s)
        seconds, inc = self._last
        self._last = (now, 1) if now > seconds else (seconds, inc + 1)
        return Timestamp(*self._last)

    def current(self) -> Timestamp:
        seconds, inc = self._last
        return Timestamp(int(time.time() - self.behind_s), 0) if seconds == 0 else Timestamp(seconds, inc)

    def jump_to(self, when: datetime) -> None:
        """Let the cluster time continue from ``when`` (never backwards)."""
        self.behind_s = max(0.0, time.time() - when.timestamp())


@contextmanager
def travelling_replica_set(behind_s: float, noop_interval: float = 0.5) -> Iterator[tuple[str, TravelClock]]:
    """An in-process emulator whose clock starts ``behind_s`` in the past: (uri, clock)."""
    port = free_port("127.0.0.1")
    clock = TravelClock(behind_s)
    # the server writes its first oplog entry while it is built: it must already have this clock
    original = mongod.ClusterClock
    mongod.ClusterClock = lambda: clock  # type: ignore[assignment,misc]
    try:
        server = EmulatorServer(ServerConfig("127.0.0.1", port, "rs0", 256.0, noop_interval, None))
    finally:
        mongod.ClusterClock = original  # type: ignore[misc]
    server.start()
    try:
        yield f"mongodb://127.0.0.1:{port}/?replicaSet=rs0", clock
    finally:
        server.faults.cancel()
        server.shutdown()
