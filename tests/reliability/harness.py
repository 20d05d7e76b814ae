"""The machinery of the reliability trials: a workload whose every write is identifiable, the source's own
change stream as ground truth, ``mongocdc run`` as a child process, and the figures each trial prints.

Every trial compares what the connector delivered with what the source's change stream says happened:

- **lost**: events of the ground truth the connector never delivered;
- **duplicated**: deliveries beyond the first of an event (at-least-once allows them for JSON Lines;
  exactly-once Kafka must have none);
- **state mismatch**: documents whose state rebuilt from the delivered records differs from the source;
- **recovery**: seconds from the end of a fault until the connector delivered a write made after it;
- **peak RSS**: the largest resident set (``VmHWM``) of any connector process of the trial.

An event is identified by its clusterTime, the document key and its ``op``: the workload never changes
one document twice in one transaction, so no two events share all three.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from bson import Timestamp
from pymongo import MongoClient
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import PyMongoError

from mongocdc_core.events import ejson
from mongocdc_core.positions import token_timestamp
from mongocdc_core.replay import Replayer, canonical

REPO = Path(__file__).resolve().parents[2]
#: ``MONGOCDC_RELIABILITY=full`` runs the trials at the size of the original fault campaign (``make reliability``).
FULL = os.environ.get("MONGOCDC_RELIABILITY", "small").lower() == "full"
OPS = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}
Identity = tuple[int, int, str, str]  # clusterTime seconds, increment, key id, op


def scale(small: int, full: int) -> int:
    """A trial's size: small in ``make test``, the campaign's size under ``make reliability``."""
    return full if FULL else small


def cluster_time(client: MongoClient[Any]) -> Timestamp:
    """The cluster time after everything ``client`` wrote."""
    ts = client.admin.command("hello")["$clusterTime"]["clusterTime"]
    assert isinstance(ts, Timestamp)
    return ts


def stop_at_arg(ts: Timestamp) -> str:
    return f"{ts.time}:{ts.inc}"


# -- figures --------------------------------------------------------------------------------------------


@dataclass
class Figures:
    """What a trial prints (one row of the reliability table)."""

    trial: str
    lost: int = 0
    duplicated: int = 0
    mismatch: int = 0
    recovery_s: float | None = None
    peak_rss_mb: float | None = None
    note: str = ""

    def line(self) -> str:
        recovery = "-" if self.recovery_s is None else f"{self.recovery_s:.2f}s"
        rss = "-" if self.peak_rss_mb is None else f"{self.peak_rss_mb:.0f}MB"
        return (f"{self.trial:<56} lost={self.lost:<4} duplicated={self.duplicated:<6} "
                f"state-mismatch={self.mismatch:<4} recovery={recovery:<8} peak-rss={rss:<7} {self.note}")

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


# -- workload ---------------------------------------------------------------------------------------------


class Workload:
    """Random inserts, updates, replaces, deletes and small transactions; every write carries a unique ``w``."""

    def __init__(self, collection: Collection[Any], seed: int, *, transactions: bool = True) -> None:
        self.collection = collection
        self.rng = random.Random(seed)
        self.transactions = transactions
        self.live: list[int] = []
        self.next_id = 0
        self.writes = 0

    def _w(self) -> int:
        self.writes += 1
        return self.writes

    def step(self) -> None:
        """One write (or one transaction of three)."""
        roll = self.rng.random()
        coll = self.collection
        if roll < 0.45 or len(self.live) < 10:
            doc_id = self.next_id
            self.next_id += 1
            coll.insert_one({"_id": doc_id, "w": self._w(), "v": self.rng.random(), "tags": ["a", doc_id % 7]})
            self.live.append(doc_id)
        elif roll < 0.70:
            coll.update_one({"_id": self.rng.choice(self.live)}, {"$set": {"w": self._w()}, "$inc": {"n": 1}})
        elif roll < 0.80:
            doc_id = self.rng.choice(self.live)
            coll.replace_one({"_id": doc_id}, {"w": self._w(), "replaced": True})
        elif roll < 0.92:
            doc_id = self.live.pop(self.rng.randrange(len(self.live)))
            coll.delete_one({"_id": doc_id})
        elif self.transactions:
            self._transaction()
        else:
            coll.update_one({"_id": self.rng.choice(self.live)}, {"$set": {"w": self._w()}})

    def _transaction(self) -> None:
        first, second = self.next_id, self.next_id + 1
        self.next_id += 2
        target = self.rng.choice(self.live)
        with self.collection.database.client.start_session() as session, session.start_transaction():
            self.collection.insert_many([{"_id": first, "w": self._w()}, {"_id": second, "w": self._w()}],
                                        session=session)
            self.collection.update_one({"_id": target}, {"$set": {"w": self._w()}}, session=session)
        self.live += [first, second]

    def run(self, steps: int, pause_s: float = 0.0) -> None:
        """``steps`` writes; a write the source refuses (a fault is under way) is retried as another one.

        Whether a failed write was applied or not, the change stream knows: the ground truth does not
        depend on this bookkeeping.
        """
        done = 0
        while done < steps:
            try:
                self.step()
            except PyMongoError:
                time.sleep(0.1)
                continue
            done += 1
            if pause_s:
                time.sleep(pause_s)

    def in_background(self, steps: int, pause_s: float = 0.0) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(steps, pause_s), daemon=True)
        thread.start()
        return thread


# -- ground truth -----------------------------------------------------------------------------------------


def key_of(doc_id: Any) -> str:
    """The ``id`` of the Debezium key for ``_id`` (what the delivered records carry)."""
    return ejson.key_id(doc_id)


def ground_truth(db: Database[Any], collection: str, start: Timestamp, stop: Timestamp) -> Counter[Identity]:
    """Every data event of ``db.collection`` in ``(start, stop]``, from the source's own change stream."""
    truth: Counter[Identity] = Counter()
    pipeline = [{"$match": {"ns.coll": collection}}]
    with db.watch(pipeline, start_at_operation_time=start, max_await_time_ms=200) as stream:
        while True:
            event = stream.try_next()
            if event is None:
                token = stream.resume_token
                scanned = token_timestamp(dict(token)) if token else None
                if scanned is not None and scanned >= stop:
                    return truth
                continue
            ct: Timestamp = event["clusterTime"]
            if ct > stop:
                return truth
            op = OPS.get(event["operationType"])
            if op is not None and ct > start:
                truth[(ct.time, ct.inc, key_of(event["documentKey"]["_id"]), op)] += 1


@dataclass
class Delivered:
    """Records of one collection's topic, in delivery order, as (key bytes, value bytes)."""

    pairs: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    torn: int = 0  # lines that do not parse (a torn line the restart did not repair)

    def events(self, start: Timestamp, stop: Timestamp) -> Counter[Identity]:
        """Data events (c/u/d) with a clusterTime in ``(start, stop]``, counted."""
        seen: Counter[Identity] = Counter()
        for key, value in self.pairs:
            if value is None:
                continue
            payload = _payload(orjson.loads(value))
            op = payload.get("op")
            if op not in ("c", "u", "d"):
                continue
            source = payload["source"]
            ct = Timestamp(source["ts_ms"] // 1000, source["ord"])
            if start < ct <= stop:
                seen[(ct.time, ct.inc, _payload(orjson.loads(key))["id"], op)] += 1
        return seen

    def rebuilt(self, namespace: str) -> list[str]:
        """The documents the records rebuild, each change event applied once.

        At-least-once delivery repeats the events after the last saved offset; applied again in file
        order, an update whose full document was already gone at lookup would follow its own delete.
        A consumer keeps the latest position per key; the trial keeps the first copy of each event.
        """
        return canonical(Replayer().apply_all(self.once()).documents(namespace))

    def once(self) -> list[tuple[bytes, bytes | None]]:
        """The records with every repeated change event (and the tombstone after a repeated delete) left out."""
        seen: set[tuple[Any, ...]] = set()
        kept: list[tuple[bytes, bytes | None]] = []
        dropped_delete: set[bytes] = set()
        for key, value in self.pairs:
            if value is None:
                if key not in dropped_delete:
                    kept.append((key, value))
                dropped_delete.discard(key)
                continue
            payload = _payload(orjson.loads(value))
            op = payload.get("op") if isinstance(payload, dict) else None
            if op in ("c", "u", "d"):
                identity = (payload["source"]["ts_ms"], payload["source"]["ord"], key, op)
                if identity in seen:
                    if op == "d":
                        dropped_delete.add(key)
                    continue
                seen.add(identity)
            kept.append((key, value))
        return kept


def _payload(value: Any) -> Any:
    return value["payload"] if isinstance(value, dict) and "payload" in value and "schema" in value else value


def read_jsonl(path: Path) -> Delivered:
    delivered = Delivered()
    if not path.exists():
        return delivered
    for line in path.read_bytes().splitlines():
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError:
            delivered.torn += 1
            continue
        value = item["value"]
        delivered.pairs.append((orjson.dumps(item["key"]), orjson.dumps(value) if value is not None else None))
    return delivered


def compare(trial: str, truth: Counter[Identity], delivered: Counter[Identity], rebuilt: list[str],
            source: list[str], **extra: Any) -> Figures:
    """The figures of a trial from its ground truth, its deliveries and the two states."""
    lost = sum(1 for identity in truth if identity not in delivered)
    duplicated = sum(count - 1 for count in delivered.values() if count > 1)
    unknown = sum(1 for identity in delivered if identity not in truth)
    mismatch = state_mismatch(rebuilt, source)
    note = f"events={sum(truth.values())}" + (f" unexpected={unknown}" if unknown else "")
    figures = Figures(trial, lost, duplicated, mismatch, note=note)
    for name, value in extra.items():
        setattr(figures, name, value)
    return figures


def state_mismatch(rebuilt: list[str], source: list[str]) -> int:
    """Documents present in one state and not identical in the other."""
    def by_id(docs: list[str]) -> dict[str, str]:
        return {orjson.dumps(orjson.loads(d).get("_id")).decode(): d for d in docs}

    left, right = by_id(rebuilt), by_id(source)
    return sum(1 for key in left.keys() | right.keys() if left.get(key) != right.get(key))


# -- the connector as a child process --------------------------------------------------------------------


class Connector:
    """``mongocdc run`` as a child process, started as often as a trial needs; knows its peak RSS."""

    def __init__(self, config: Path, sink: str, offsets: str, workdir: Path, *extra: str) -> None:
        self.args = [sys.executable, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", sink,
                     "--offsets", offsets, "--no-progress", *extra]
        self.workdir = workdir
        self.log = workdir / "connector.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak_rss_kb = 0
        self.starts = 0
        self._ready = threading.Event()
        self._reader: threading.Thread | None = None

    def start(self, *args: str) -> Connector:
        self._ready.clear()
        self.starts += 1
        log = open(self.log, "ab")  # noqa: SIM115 - the reader thread closes it
        log.write(f"--- start {self.starts}: {' '.join(args)}\n".encode())
        log.flush()
        self.proc = subprocess.Popen([*self.args, *args], stdout=subprocess.PIPE, stderr=log, cwd=REPO)
        self._reader = threading.Thread(target=self._read, args=(self.proc, log), daemon=True)
        self._reader.start()
        threading.Thread(target=self._sample_rss, args=(self.proc,), daemon=True).start()
        return self

    def _read(self, proc: subprocess.Popen[bytes], log: Any) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if line.startswith(b"mongocdc: streaming after"):
                self._ready.set()
        log.close()

    def wait_streaming(self, timeout: float = 120) -> float:
        """Seconds until the connector reported that it streams (it recovered)."""
        started = time.monotonic()
        while not self._ready.wait(0.1):
            if not self.running() or time.monotonic() - started > timeout:
                raise AssertionError(f"the connector did not start streaming:\n{self.tail()}")
        return time.monotonic() - started

    def running(self) -> bool:
        """Whether the last started process is still alive."""
        assert self.proc is not None
        return self.proc.poll() is None

    def _sample_rss(self, proc: subprocess.Popen[bytes]) -> None:
        """Follow the process's peak resident set (VmHWM) until it ends.

        Not ``wait4``'s ``ru_maxrss``: for a child spawned from this (large) test process it reports
        the parent's peak, inherited at exec.
        """
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            try:
                for line in status.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_rss_kb = max(self.peak_rss_kb, int(line.split()[1]))
            except (OSError, ValueError):
                pass
            time.sleep(0.1)

    def wait(self, timeout: float = 300) -> int:
        """Wait for the process to end; its exit status (negative: killed by that signal)."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the connector did not end within {timeout}s:\n{self.tail()}") from None
        if self._reader is not None:
            self._reader.join(10)
        return code

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.wait(30)

    def terminate(self, timeout: float = 120) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def run(self, *args: str, timeout: float = 300) -> int:
        """One bounded run (e.g. ``--stop-at``) to its end."""
        self.start(*args)
        return self.wait(timeout)

    @property
    def peak_rss_mb(self) -> float:
        return self.peak_rss_kb / 1024

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class JsonlWatcher:
    """Follows a growing JSON Lines file: which key ids were delivered so far."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.ids: set[str] = set()

    def poll(self) -> set[str]:
        if self.path.exists():
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offset += len(complete)
            for line in complete.splitlines():
                try:
                    key = orjson.loads(line)["key"]
                except orjson.JSONDecodeError:
                    continue
                if isinstance(key, dict):
                    self.ids.add(str(_payload(key).get("id")))
        return self.ids

    def delivered(self, doc_id: Any) -> bool:
        return key_of(doc_id) in self.poll()


def insert_retrying(collection: Collection[Any], document: Mapping[str, Any], timeout: float = 120) -> None:
    """Insert once the source takes writes again (a duplicate key means an earlier attempt landed)."""
    from pymongo.errors import DuplicateKeyError

    deadline = time.monotonic() + timeout
    while True:
        try:
            collection.insert_one(dict(document))
            return
        except DuplicateKeyError:
            return
        except PyMongoError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def write_config(path: Path, properties: Mapping[str, Any]) -> Path:
    path.write_bytes(orjson.dumps({"name": properties.get("name", "reliability"),
                                   "config": {k: str(v) for k, v in properties.items()}}))
    return path


def connector_properties(uri: str, db: str, **extra: Any) -> dict[str, Any]:
    """A connector capturing ``db`` with quick polling and frequent offset commits."""
    return {
        "name": f"rel-{db}",
        "mongodb.connection.string": uri,
        "topic.prefix": "rel",
        "collection.include.list": rf"{db}\..*",
        "poll.interval.ms": 50,
        "cursor.max.await.time.ms": 100,
        "connect.backoff.initial.delay.ms": 100,
        "connect.backoff.max.delay.ms": 1000,
        "mongodb.heartbeat.frequency.ms": 500,
        "mongodb.server.selection.timeout.ms": 5000,
        "retriable.restart.connector.wait.ms": 200,
        "offset.flush.interval.ms": 200,
        "max.batch.size": 256,
        "mongocdc.schemas.enable": "false",
        **extra,
    }


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> float:
    """Seconds until ``predicate()`` held (AssertionError after ``timeout``)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        time.sleep(interval)
    return time.monotonic() - started


def grep_files(root: Path, needles: Iterable[str]) -> Iterator[tuple[Path, str]]:
    """(file, needle) for every needle found in any file under ``root``."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for needle in needles:
            if needle.encode() in data:
                yield path, needle
