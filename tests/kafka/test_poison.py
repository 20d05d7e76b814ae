"""Poison pills against a real broker: no input loops the connector into identical crashes.

A document whose record is larger than its topic accepts stops ``mongocdc run`` in ``fail`` mode with
one line naming the event and how to get past it (exit code 8, the same line on every restart, not a
traceback), and is skipped with ``event.processing.failure.handling.mode=warn``. A 2 MiB bad signal's
rejection notification, sent to a Kafka topic, stays far below Kafka's message size.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import orjson
from pymongo.database import Database

from tests.kafka.kafka_support import REPO_ROOT, make_config, read_topic, write_config


def _now(db: Database[Any]) -> str:
    ts = db.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    return f"{ts.time}:{ts.inc}"


def _run(config: Path, bootstrap: str, offsets: Path, stop_at: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", f"kafka:{bootstrap}",
         "--offsets", str(offsets), "--no-progress", "--stop-at", stop_at],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )


def _ids(bootstrap: str, topic: str) -> list[Any]:
    return [orjson.loads(orjson.loads(v)["after"])["_id"] for _, _, v in read_topic(bootstrap, topic) if v]


def test_an_oversized_record_fails_with_one_line_every_time_then_warn_skips_it(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database[Any], tmp_path: Path
) -> None:
    cfg = make_config(mongo_uri, fresh_db.name, **{"snapshot.mode": "no_data"})
    config = write_config(tmp_path / "connector.json", cfg)
    offsets = tmp_path / "offsets.json"
    first = _run(config, kafka_bootstrap, offsets, _now(fresh_db))  # pins the stream's start
    assert first.returncode == 0, first.stderr
    fresh_db.a.insert_one({"_id": "before"})
    fresh_db.a.insert_one({"_id": "huge", "blob": "x" * 1_500_000})  # > 1 MB: more than any default topic takes
    fresh_db.a.insert_one({"_id": "after"})
    stop_at = _now(fresh_db)
    topic = cfg.data_topic(fresh_db.name, "a")

    failures = [_run(config, kafka_bootstrap, offsets, stop_at) for _ in range(2)]
    for failed in failures:
        assert failed.returncode == 8, failed.stderr
        assert "Traceback" not in failed.stderr
        line = next(line for line in failed.stderr.splitlines() if "cannot deliver" in line)
        assert f"change event of {fresh_db.name}.a" in line and "huge" in line and "clusterTime" in line
        assert "max.message.bytes" in line and "event.processing.failure.handling.mode=warn" in line
    assert failures[0].stderr.count("cannot deliver") == failures[1].stderr.count("cannot deliver") == 1
    assert "after" not in _ids(kafka_bootstrap, topic)  # the offset never passed the refused record

    warn = write_config(tmp_path / "warn.json", cfg.with_properties({"event.processing.failure.handling.mode": "warn"}))
    skipped = _run(warn, kafka_bootstrap, offsets, stop_at)
    assert skipped.returncode == 0, skipped.stderr
    assert "skipping an event (event.processing.failure.handling.mode=warn)" in " ".join(skipped.stderr.split())
    ids = _ids(kafka_bootstrap, topic)
    assert "huge" not in ids and set(ids) == {"before", "after"}


def test_a_2_mib_bad_signal_is_rejected_by_a_notification_that_fits_in_a_kafka_message(
    kafka_bootstrap: str, mongo_uri: str, fresh_db: Database[Any], tmp_path: Path
) -> None:
    notifications = f"notifications-{uuid.uuid4().hex[:8]}"
    cfg = make_config(
        mongo_uri, fresh_db.name, **{
            "snapshot.mode": "no_data", "signal.data.collection": f"{fresh_db.name}.signals",
            "notification.enabled.channels": "sink,log", "notification.sink.topic.name": notifications,
        },
    )
    fresh_db.signals.insert_one({"_id": "warmup"})
    config = write_config(tmp_path / "connector.json", cfg)
    offsets = tmp_path / "offsets.json"
    assert _run(config, kafka_bootstrap, offsets, _now(fresh_db)).returncode == 0
    bad = "y" * (2 * 1024 * 1024)
    fresh_db.signals.insert_one({"_id": "bad", "type": bad})
    fresh_db.signals.insert_one({"_id": "bad2", "type": "execute-snapshot", "data": {"data-collections": [bad]}})
    fresh_db.a.insert_one({"_id": "after"})
    result = _run(config, kafka_bootstrap, offsets, _now(fresh_db))
    assert result.returncode == 0, result.stderr[-3000:]
    assert max(len(line) for line in result.stderr.splitlines()) < 16 * 1024  # never logged whole
    rejected = [orjson.loads(v) for _, _, v in read_topic(kafka_bootstrap, notifications) if v]
    assert [n["type"] for n in rejected if n["aggregate_type"] == "Signal"] == ["REJECTED", "REJECTED"]
    assert max(len(orjson.dumps(n)) for n in rejected) < 16 * 1024
    assert _ids(kafka_bootstrap, cfg.data_topic(fresh_db.name, "a")) == ["after"]
