"""``mongocdc run``'s logs as a log shipper and a person at a terminal meet them: run as subprocesses.

When stderr is a file: one line per event (never wrapped, no colour, no progress bars), or one JSON
object per line with ``--log-format json`` / ``MONGOCDC_LOG_FORMAT=json``; progress bars only on a
terminal (a pty here).
"""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from pymongo.database import Database

from tests.test_cli import _config

PY = sys.executable
# The head of every event in text logs off a terminal: an event that spanned lines would leave a line without it.
EVENT_HEAD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")
LONG_MESSAGE = "a log signal whose message is far wider than any terminal, " * 8
BAR = "━"  # rich's progress bar


def _run_until_snapshot_completed(tmp_path: Path, uri: str, db: Database[Any], *extra: str,
                                  env: dict[str, str] | None = None) -> str:
    """Run the connector with stderr in a file through an incremental snapshot (its notifications on the
    log channel) and a log signal with a long message; stop it with SIGTERM; return what stderr got."""
    db.items.insert_many([{"_id": i, "name": f"item {i}"} for i in range(3)])
    db.signals.insert_one({"_id": "warmup"})
    signals = tmp_path / "signals.txt"
    signals.write_bytes(b"\n".join(orjson.dumps(line) for line in (
        {"id": "s1", "type": "log", "data": {"message": LONG_MESSAGE}},
        {"id": "s2", "type": "execute-snapshot", "data": {"data-collections": [f"{db.name}.items"], "type": "incremental"}},
    )) + b"\n")
    config = _config(
        tmp_path, uri, db.name, **{
            "snapshot.mode": "no_data", "signal.data.collection": f"{db.name}.signals",
            "signal.enabled.channels": "source,file", "signal.file": str(signals),
            "signal.poll.interval.ms": "100", "notification.enabled.channels": "log",
        },
    )
    log_path = tmp_path / "stderr.log"
    with log_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [PY, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", f"jsonl:{tmp_path}/out",
             "--offsets", str(tmp_path / "o.json"), *extra],
            stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, **(env or {})},
        )
        try:
            deadline = time.monotonic() + 120  # a guard against hanging; the oracle is the log's content
            while '"COMPLETED"' not in log_path.read_text() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0, log_path.read_text()
    return log_path.read_text()


def test_text_logs_to_a_file_are_one_line_per_event(tmp_path: Path, mongo_uri: str, fresh_db: Database[Any]) -> None:
    text = _run_until_snapshot_completed(tmp_path, mongo_uri, fresh_db)
    lines = text.splitlines()
    assert len(lines) > 5 and "\x1b[" not in text and BAR not in text
    assert [line for line in lines if not EVENT_HEAD.match(line)] == []
    # A notification is one line whose JSON parses whole, as a shipper would parse it.
    notifications = [orjson.loads(line.split("Notification from cli-test: ", 1)[1])
                     for line in lines if "Notification from cli-test: " in line]
    assert [n["type"] for n in notifications if n["aggregate_type"] == "Incremental Snapshot"][-1] == "COMPLETED"
    assert any(LONG_MESSAGE in line for line in lines)
    assert any(line.endswith("mongocdc: SIGTERM: stopping after the current batch") for line in lines)
    assert any(re.search(r"mongocdc: stopped: stop; \d+ records", line) for line in lines)


@pytest.mark.parametrize("how", ["flag", "env"])
def test_json_logs_are_one_object_per_line(tmp_path: Path, mongo_uri: str, fresh_db: Database[Any], how: str) -> None:
    extra, env = (["--log-format", "json"], None) if how == "flag" else ([], {"MONGOCDC_LOG_FORMAT": "json"})
    text = _run_until_snapshot_completed(tmp_path, mongo_uri, fresh_db, *extra, env=env)
    events = [orjson.loads(line) for line in text.splitlines()]  # every line is one JSON object
    assert len(events) > 5
    for event in events:
        assert {"timestamp", "level", "logger", "message"} <= set(event)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["timestamp"])
    notifications = [e["notification"] for e in events if "notification" in e]
    snapshot = [n for n in notifications if n["aggregate_type"] == "Incremental Snapshot"]
    assert snapshot[0]["type"] == "STARTED" and snapshot[-1]["type"] == "COMPLETED"
    assert all(e["level"] == "INFO" and e["logger"] == "mongocdc_core.notifications"
               for e in events if "notification" in e)
    assert any(LONG_MESSAGE in e["message"] for e in events)
    assert any(e["message"] == "SIGTERM: stopping after the current batch" for e in events)
    (stopped,) = [e for e in events if e["message"].startswith("stopped: ")]
    assert stopped["stopped_because"] == "stop" and stopped["records"] >= 3  # the snapshot's reads at least
    assert stopped["metrics"]["streaming"]["TotalNumberOfEventsSeen"] >= 0


@pytest.mark.parametrize("command", [["mongocdc_core.cli", "run", "--config", "c", "--sink", "jsonl:x", "--offsets", "o"],
                                     ["mongocdc_core.cli", "tables", "maintain", "--tables", "t"],
                                     ["mongocdc_dagster.check_cli"],
                                     ["mongocdc_dagster.local_stack"],
                                     ["mongocdc_devstack.kafka_broker", "--data-dir", "d"],
                                     ["mongocdc_devstack.kafka_broker", "jars", "--dir", "d"]],
                         ids=["mongocdc-run", "mongocdc-tables", "mongocdc-check", "make-dev", "mongocdc-kafka",
                              "mongocdc-kafka-jars"])
def test_a_bad_log_format_in_the_environment_is_a_usage_error(command: list[str]) -> None:
    result = subprocess.run([PY, "-m", *command], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "MONGOCDC_LOG_FORMAT": "xml"})
    assert result.returncode == 2 and "MONGOCDC_LOG_FORMAT: expected one of text, json, got 'xml'" in result.stderr
    assert "Traceback" not in result.stderr


def _snapshot_only(tmp_path: Path, uri: str, db: Database[Any], stderr: int) -> subprocess.Popen[bytes]:
    db.items.insert_many([{"_id": i} for i in range(50)])
    tmp_path.mkdir()
    config = _config(tmp_path, uri, db.name, **{"snapshot.mode": "initial_only"})
    return subprocess.Popen(
        [PY, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", f"jsonl:{tmp_path}/out",
         "--offsets", str(tmp_path / "o.json")],
        stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"},
    )


def test_progress_bars_only_on_a_terminal(tmp_path: Path, mongo_uri: str, fresh_db: Database[Any]) -> None:
    # On a terminal (a pty): rich's bars.
    master, slave = pty.openpty()
    proc = _snapshot_only(tmp_path / "tty", mongo_uri, fresh_db, slave)
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # read until the process closes its end, so it never blocks on a full pty
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    assert proc.wait(timeout=120) == 0
    reader.join(timeout=60)
    os.close(master)
    on_tty = b"".join(chunks).decode(errors="replace")
    assert BAR in on_tty and f"snapshot {fresh_db.name}.items" in on_tty and "50/50" in on_tty
    # In a file: no bar, no colour; the counts and rate as lines instead.
    fresh_db.items.drop()
    log_path = tmp_path / "stderr.log"
    with log_path.open("wb") as stderr:
        assert _snapshot_only(tmp_path / "file", mongo_uri, fresh_db, stderr.fileno()).wait(timeout=120) == 0
    in_file = log_path.read_text()
    assert BAR not in in_file and "\x1b[" not in in_file
    assert re.search(rf"snapshot of {fresh_db.name}\.items copied 50 documents in \d+ s \([\d,]+/s\)", in_file)
    assert all(EVENT_HEAD.match(line) for line in in_file.splitlines())
