"""``NumberOfDisconnects`` and ``NumberOfPrimaryElections`` count the same events the same way whatever
the fault: a step-down and a restart of the replica set (short, or long enough for the connector to
restart with a new client) are each one loss of the primary and one election; an outage that ends the
run is one disconnect, in the closing summary as in the metrics file.

Each test has a replica set of its own (with a data directory, so a restart keeps the data and, as
mongod, elects its member again with a new term).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from pymongo import MongoClient, monitoring
from pymongo.database import Database
from pymongo.errors import PyMongoError

from mongocdc_core.coordinator import Engine
from mongocdc_core.offsets import MemoryOffsetStore
from mongocdc_core.receiver import ConnectionState, ProgressListener
from mongocdc_core.run_command import EXIT_UNREACHABLE
from mongocdc_devstack.fixture import EmulatedReplicaSet
from tests.engine.engine_support import Background, MemorySink, make_config, wait_for

pytestmark = pytest.mark.fault


@pytest.fixture
def replica_set(tmp_path: Path) -> Iterator[EmulatedReplicaSet]:
    emulator = EmulatedReplicaSet(noop_interval=0.5, dbpath=str(tmp_path / "db")).start()
    try:
        yield emulator
    finally:
        emulator.stop()


class Attempts(ProgressListener):
    """The failed reconnection attempts the engine reported."""

    def __init__(self) -> None:
        self.states: list[ConnectionState] = []

    def connecting(self, state: ConnectionState) -> None:
        self.states.append(state)


@dataclass
class StreamingEngine:
    """An engine streaming a replica set's ``metrics`` database into memory, and a writer to that database."""

    db: Database[Any]
    offsets: MemoryOffsetStore
    sink: MemorySink
    attempts: Attempts
    engine: Engine
    background: Background

    def delivered(self, marker: object) -> bool:
        """Whether the insert of ``_id`` ``marker`` reached the sink (and the engine has not failed)."""
        self.background.check()
        return any(orjson.loads(v["after"])["_id"] == marker for v in self.sink.values() if v["op"] == "c")


@contextmanager
def streaming_engine(replica_set: EmulatedReplicaSet, attempts: Attempts | None = None,
                     **properties: object) -> Iterator[StreamingEngine]:
    """The set-up of the streaming tests: no snapshot (unless ``properties`` say otherwise), a short server
    selection and few connection attempts, so an outage soon restarts the connector with a new client. A context
    (not a fixture): a test may install command listeners before the engine's clients are made."""
    writer: MongoClient[Any] = MongoClient(replica_set.uri, serverSelectionTimeoutMS=30_000, retryWrites=True)
    db = writer["metrics"]
    db.warmup.insert_one({})  # a fresh emulator's oplog must not be empty
    cfg = make_config(replica_set.uri, db.name, **{
        "snapshot.mode": "no_data", "mongodb.server.selection.timeout.ms": 300, "connect.max.attempts": 2,
        "retriable.restart.connector.wait.ms": 100, **properties,
    })
    offsets = MemoryOffsetStore()
    sink = MemorySink()
    attempts = attempts or Attempts()
    engine = Engine(cfg, sink, offsets, progress=attempts)
    background = Background(engine).start()
    try:
        yield StreamingEngine(db, offsets, sink, attempts, engine, background)
    finally:
        engine.stop()
        background.wait()
        writer.close()


def step_down(emulator: EmulatedReplicaSet, attempts: Attempts) -> None:
    with MongoClient(emulator.uri, serverSelectionTimeoutMS=10_000) as client:
        try:
            client.admin.command("replSetStepDown", 1, force=True, secondaryCatchUpPeriodSecs=0)
        except PyMongoError:  # the stepping-down primary may close the connection, as mongod does
            pass


def restart(emulator: EmulatedReplicaSet, attempts: Attempts) -> None:
    emulator.stop()
    emulator.start()


def long_restart(emulator: EmulatedReplicaSet, attempts: Attempts) -> None:
    """Down long enough for the reader to use up its reconnection attempts and the engine to restart the
    connector (a new client) before the replica set is back."""
    emulator.stop()
    wait_for(lambda: len(attempts.states) >= 4, timeout=60)
    emulator.start()


@pytest.mark.parametrize(("fault", "losses"), [(step_down, 1), (step_down, 2), (restart, 1), (restart, 2), (long_restart, 1)],
                         ids=["step-down", "step-down-twice", "restart", "restart-twice", "long-restart"])
def test_each_loss_of_the_primary_is_one_disconnect_and_one_election(
        replica_set: EmulatedReplicaSet, fault: Callable[[EmulatedReplicaSet, Attempts], None], losses: int) -> None:
    with streaming_engine(replica_set) as run:
        wait_for(lambda: run.offsets.load() is not None)
        run.db.a.insert_one({"_id": "before"})
        for loss in range(losses):
            fault(replica_set, run.attempts)
            run.db.a.insert_one({"_id": loss})  # written to the new primary: delivered once the stream resumed there
            wait_for(lambda marker=loss: run.delivered(marker), timeout=60)
    engine = run.engine
    streaming, snapshot = engine.metrics.streaming, engine.metrics.snapshot
    assert (streaming.NumberOfDisconnects, snapshot.NumberOfDisconnects) == (losses, 0)
    assert streaming.NumberOfPrimaryElections == losses
    assert (f"connection: {losses} disconnects (snapshot 0, streaming {losses}), {losses} primary elections"
            in engine.metrics.summary())


class HeldReply(monitoring.CommandListener):
    """Once armed, holds the reply of the next ``getMore`` in the thread that read it until released: the
    server answered while it was up, and the connector gets the answer only after the loss was reported."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.holding = threading.Event()
        self.release = threading.Event()

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        """Nothing to hold before the reply."""

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.command_name == "getMore" and self.armed.is_set():
            self.armed.clear()
            self.holding.set()
            self.release.wait(60)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        """A failed getMore is not held."""


def test_a_reply_read_as_the_server_went_away_does_not_end_the_loss(
        replica_set: EmulatedReplicaSet, monkeypatch: pytest.MonkeyPatch) -> None:
    """The change stream's getMore is answered, the server stops, the driver's monitor reports the loss, and
    only then does the stream get its (empty) answer: an answer to a question asked before the loss, which
    ends nothing. The stream's next read fails, the connector restarts, the server comes back: one outage,
    one disconnect (an earlier version took the late answer as MongoDB answering again and counted two)."""
    held = HeldReply()
    monkeypatch.setattr(monitoring, "_LISTENERS", monitoring._Listeners([held], [], [], [], []))  # clients made from now
    with streaming_engine(replica_set) as run:
        engine = run.engine
        try:
            wait_for(lambda: run.offsets.load() is not None)
            run.db.a.insert_one({"_id": "before"})
            wait_for(lambda: run.delivered("before"), timeout=60)
            held.armed.set()
            wait_for(held.holding.is_set, timeout=60)  # a getMore answered, its reply not handed over yet
            replica_set.stop()
            wait_for(lambda: engine.metrics.streaming.NumberOfDisconnects == 1, timeout=60)  # the monitor saw it go
            held.release.set()
            wait_for(lambda: len(run.attempts.states) >= 4, timeout=60)  # the stream's attempts, then the restart's
            replica_set.start()
            run.db.a.insert_one({"_id": "after"})
            wait_for(lambda: run.delivered("after"), timeout=60)
        finally:
            held.release.set()  # before the engine stops: a held reader would keep it from stopping
    assert (engine.metrics.streaming.NumberOfDisconnects, engine.metrics.snapshot.NumberOfDisconnects) == (1, 0)


def test_a_run_an_outage_ends_closes_with_its_disconnect(replica_set: EmulatedReplicaSet, tmp_path: Path) -> None:
    """``mongocdc run`` ended by an outage that outlasts its retries still closes with the metrics' summary:
    the loss is one disconnect (and no election), in the summary, in the last event's fields and in the
    metrics file, which carries ``custom.metric.tags`` as the Prometheus endpoint does."""
    with MongoClient(replica_set.uri, serverSelectionTimeoutMS=30_000) as writer:
        writer.metrics.warmup.insert_one({})
    config = tmp_path / "connector.properties"
    config.write_text("\n".join([
        f"mongodb.connection.string={replica_set.uri}", "topic.prefix=outage", "collection.include.list=metrics\\..*",
        "snapshot.mode=no_data", "custom.metric.tags=env=test", "connect.max.attempts=2",
        "mongodb.server.selection.timeout.ms=300", "retriable.restart.connector.wait.ms=100", "errors.max.retries=1",
    ]) + "\n")
    metrics_file = tmp_path / "metrics.json"
    with (tmp_path / "stderr.log").open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink",
             f"jsonl:{tmp_path / 'out'}", "--offsets", str(tmp_path / "offsets.json"), "--no-progress",
             "--metrics-file", str(metrics_file), "--log-format", "json"],
            stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            assert proc.stdout is not None and proc.stdout.readline().startswith("mongocdc: streaming after")
            replica_set.stop()
            assert proc.wait(timeout=180) == EXIT_UNREACHABLE
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    events = [orjson.loads(line) for line in (tmp_path / "stderr.log").read_bytes().splitlines()]
    messages = [event["message"] for event in events]
    # The server stops as the stream opens: its reply may reach the connector after the loss was reported,
    # which ends nothing (test_a_reply_read_as_the_server_went_away_does_not_end_the_loss): one disconnect.
    assert "connection: 1 disconnects (snapshot 0, streaming 1), 0 primary elections" in messages
    last = events[-1]
    assert last["level"] == "ERROR" and "unreachable" in last["message"]
    assert last["metrics"]["streaming"]["NumberOfDisconnects"] == 1
    written = orjson.loads(metrics_file.read_bytes())
    streaming = written["debezium.mongodb:type=connector-metrics,context=streaming,server=outage,task=0,env=test"]
    assert (streaming["NumberOfDisconnects"], streaming["NumberOfPrimaryElections"]) == (1, 0)


class HeldDelivery(Attempts):
    """Holds the copier's delivery of a snapshot's first chunk until released: meanwhile it reads ahead."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = threading.Event()
        self.release = threading.Event()

    def snapshot_progress(self, namespace: str, copied: int, total: int | None) -> None:
        if not self.holding.is_set():
            self.holding.set()
            self.release.wait(60)


class GetMores(monitoring.CommandListener):
    """Counts the answered ``getMore``s of one collection."""

    def __init__(self, collection: str) -> None:
        self.collection = collection
        self.asked: set[int] = set()
        self.answered = 0

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if event.command_name == "getMore" and event.command.get("collection") == self.collection:
            self.asked.add(event.request_id)

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        if event.request_id in self.asked:
            self.answered += 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        """Not an answer."""


def test_a_snapshot_batch_read_before_the_loss_and_handed_over_after_it_does_not_end_the_loss(
        replica_set: EmulatedReplicaSet, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blocking snapshot's copier reads a range's next batches while the previous one is delivered. The server
    stops after the whole range was read and before it was handed over: handing it over ends nothing (each batch
    carries the losses counted when it was asked for), so the paused stream's reads that keep failing are the
    same outage: one disconnect. An earlier version took the batches as MongoDB answering again, and the
    stream's next failed read counted a second one."""
    getmores = GetMores("big")
    monkeypatch.setattr(monitoring, "_LISTENERS", monitoring._Listeners([getmores], [], [], [], []))
    with MongoClient(replica_set.uri, serverSelectionTimeoutMS=30_000) as client:
        client.metrics.big.insert_many([{"_id": i} for i in range(18)])  # batches of 5, 5, 5 and 3: the last ends it
    held = HeldDelivery()
    properties = {"signal.data.collection": "metrics.signals", "snapshot.fetch.size": 5,
                  "connect.max.attempts": 1000}  # the stream keeps failing its reads while the server is down

    def copied() -> int:
        return sum(orjson.loads(v["after"])["_id"] in range(18) for v in run.sink.values() if v["op"] == "r")

    with streaming_engine(replica_set, held, **properties) as run:
        engine = run.engine
        try:
            wait_for(lambda: run.offsets.load() is not None)
            run.db.signals.insert_one({"type": "execute-snapshot",
                                       "data": {"data-collections": ["metrics.big"], "type": "blocking"}})
            wait_for(held.holding.is_set, timeout=60)  # the first chunk delivered, its progress not reported yet
            wait_for(lambda: getmores.answered >= 3, timeout=60)  # the range read to its end, not handed over
            replica_set.stop()
            wait_for(lambda: engine.metrics.snapshot.NumberOfDisconnects + engine.metrics.streaming.NumberOfDisconnects
                     == 1, timeout=60)  # the loss is seen
            held.release.set()
            wait_for(lambda: copied() == 18, timeout=60)  # the batches read before the loss were handed over after it
            failed = len(held.states)
            wait_for(lambda: len(held.states) >= failed + 2, timeout=60)  # the stream's reads fail on after them
            replica_set.start()
            run.db.big.insert_one({"_id": "after"})
            wait_for(lambda: run.delivered("after"), timeout=60)
        finally:
            held.release.set()  # before the engine stops: the held copier would keep it from stopping
    assert engine.metrics.snapshot.NumberOfDisconnects + engine.metrics.streaming.NumberOfDisconnects == 1
