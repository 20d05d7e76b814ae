"""Helpers shared by the Kafka sink, offset, signal and fault tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.dispatcher import ProgressListener
from mongocdc_core.positions import Position

REPO_ROOT = Path(__file__).resolve().parents[2]
KafkaRecord = tuple[bytes | None, bytes | None]


def make_config(uri: str, db: str, **props: Any) -> ConnectorConfig:
    """A fast-polling config capturing every collection of ``db`` (unique topic prefix per test)."""
    base: dict[str, Any] = {
        "name": f"conn-{uuid.uuid4().hex[:8]}",
        "mongodb.connection.string": uri,
        "topic.prefix": f"p{uuid.uuid4().hex[:8]}",
        "collection.include.list": f"{db}\\..*",
        "poll.interval.ms": 50,
        "cursor.max.await.time.ms": 100,
        "connect.backoff.initial.delay.ms": 50,
        "connect.backoff.max.delay.ms": 400,
        "offset.flush.interval.ms": 200,
        "mongocdc.schemas.enable": "false",
    }
    base.update(props)
    return ConnectorConfig.from_dict({k: str(v) for k, v in base.items()})


def read_topic(
    bootstrap: str, topic: str, *, committed: bool = False, timeout: float = 60.0
) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of ``topic`` as (partition, key, value), partition by partition, in log order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed" if committed else "read_uncommitted",
        }
    )
    out: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        md = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if md is None or md.error is not None:
            return []
        pending = set(md.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.partitions])
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"timed out reading {topic}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                pending.discard(msg.partition())
                continue
            out.append((msg.partition() or 0, msg.key(), msg.value()))
    finally:
        consumer.close()
    out.sort(key=lambda r: r[0])  # stable: log order within each partition
    return out


def list_topics(bootstrap: str, prefix: str) -> set[str]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "lister"})
    try:
        return {t for t in consumer.list_topics(timeout=30).topics if t.startswith(prefix)}
    finally:
        consumer.close()


def read_jsonl(directory: Path) -> dict[str, list[KafkaRecord]]:
    """A jsonl sink directory as topic -> [(key bytes, value bytes)] with Kafka's byte forms."""
    out: dict[str, list[KafkaRecord]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        rows = []
        for line in path.read_bytes().splitlines():
            obj = orjson.loads(line)
            key = None if obj["key"] is None else orjson.dumps(obj["key"])
            value = None if obj["value"] is None else orjson.dumps(obj["value"])
            rows.append((key, value))
        out[path.name.removesuffix(".jsonl")] = rows
    return out


def normalise(value: bytes | None) -> Any:
    """A record value without what differs between two runs of the same data: the connector's
    processing times, and in a snapshot read the time it was read and the ``ord`` of the position its
    snapshot started at (two engines started one after the other can start on either side of an
    oplog entry, such as the server's periodic no-op)."""
    if value is None:
        return None
    obj = orjson.loads(value)
    payload = obj.get("payload", obj) if isinstance(obj, dict) else obj
    if isinstance(payload, dict):
        for field in ("ts_ms", "ts_us", "ts_ns"):
            payload.pop(field, None)
            if payload.get("op") == "r":
                payload["source"].pop(field, None)
        if payload.get("op") == "r":
            payload["source"].pop("ord", None)
    return obj


def by_key(records: Sequence[KafkaRecord]) -> dict[Any, list[Any]]:
    """Per-key sequences of normalised values (the order Kafka guarantees)."""
    out: dict[Any, list[Any]] = {}
    for key, value in records:
        k = None if key is None else orjson.loads(key)
        out.setdefault(orjson.dumps(k, option=orjson.OPT_SORT_KEYS), []).append(normalise(value))
    return out


class StreamingStarted(ProgressListener):
    """Set once the engine streams: writes after that are change events, not snapshot reads."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def streaming_started(self, position: Position | None) -> None:
        self.started.set()


def wait_for(predicate: Callable[[], bool], timeout: float = 30, interval: float = 0.05, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"condition not reached in {timeout}s {what}".strip())


CONNECTOR_SCRIPT = Path(__file__).with_name("connector_proc.py")


class ConnectorProcess:
    """``connector_proc.py`` as a child process: start, wait for READY, kill -9 or SIGTERM."""

    def __init__(self, config_path: Path, sink: str, offsets: str, log_path: Path) -> None:
        self.args = [sys.executable, str(CONNECTOR_SCRIPT), str(config_path), sink, offsets]
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 60) -> ConnectorProcess:
        self._ready.clear()
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the reader thread
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log, cwd=REPO_ROOT)
        threading.Thread(target=self._read, args=(self.proc, log), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"connector did not become ready; log:\n{self.log_path.read_text()[-4000:]}")
        return self

    def _read(self, proc: subprocess.Popen[bytes], log: Any) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            if line.strip() == b"READY":
                self._ready.set()
        log.close()

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout: float = 60) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def write_config(path: Path, cfg: ConnectorConfig) -> Path:
    path.write_bytes(orjson.dumps({"name": cfg.properties.get("name"), "config": dict(cfg.properties)}))
    return path


def data_events(bootstrap: str, topic: str, *, committed: bool) -> list[tuple[int, str]]:
    """(document id, op) of every data event in ``topic`` (tombstones left out), in log order."""
    out = []
    for _, key, value in read_topic(bootstrap, topic, committed=committed):
        if value is None:
            continue
        payload = orjson.loads(value)
        out.append((int(orjson.loads(orjson.loads(key or b"{}")["id"])), payload["op"]))
    return out


def write_load(coll: Any, ids: range) -> None:
    """Insert every id, then update the even ones: the expected events are known exactly."""
    for start in range(ids.start, ids.stop, 10):
        coll.insert_many([{"_id": i, "v": 0} for i in range(start, min(start + 10, ids.stop))])
        time.sleep(0.005)
    for i in ids:
        if i % 2 == 0:
            coll.update_one({"_id": i}, {"$set": {"v": 1}})


def expected_events(ids: range) -> list[tuple[int, str]]:
    return [(i, "c") for i in ids] + [(i, "u") for i in ids if i % 2 == 0]
