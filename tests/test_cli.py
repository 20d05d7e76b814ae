"""The ``mongocdc`` command and ``make demo``'s module, run as a user would: as subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from pymongo.database import Database

from mongocdc_devstack.fixture import free_port

PY = sys.executable


def _mongocdc(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "mongocdc_core.cli", *args], capture_output=True, text=True, timeout=timeout)


def _config(tmp_path: Path, uri: str, db: str, **extra: str) -> Path:
    path = tmp_path / "connector.json"
    config = {
        "mongodb.connection.string": uri,
        "topic.prefix": "cli",
        "collection.include.list": rf"{db}\..*",
        "offset.flush.interval.ms": "500",
        **extra,
    }
    path.write_bytes(orjson.dumps({"name": "cli-test", "config": config}))
    return path


def test_version() -> None:
    from importlib import metadata

    result = _mongocdc("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"mongocdc {metadata.version('mongocdc')}"


def test_usage_and_unknown_command() -> None:
    assert _mongocdc().returncode == 2
    assert "run" in _mongocdc("--help").stdout
    result = _mongocdc("frobnicate")
    assert result.returncode == 2 and "unknown command 'frobnicate'" in result.stderr


def test_invalid_config_names_the_property(tmp_path: Path) -> None:
    path = tmp_path / "bad.properties"
    path.write_text("mongodb.connection.string=mongodb://127.0.0.1:1/?replicaSet=rs0\ntopic.prefix=x\nsnapshot.mode=sometimes\n")
    result = _mongocdc("run", "--config", str(path), "--sink", f"jsonl:{tmp_path}/out", "--offsets", str(tmp_path / "o.json"))
    assert result.returncode == 2 and "snapshot.mode" in result.stderr


def test_bad_sink_is_refused(tmp_path: Path, mongo_uri: str) -> None:
    config = _config(tmp_path, mongo_uri, "x")
    result = _mongocdc("run", "--config", str(config), "--sink", "s3:bucket", "--offsets", str(tmp_path / "o.json"))
    assert result.returncode == 2 and "s3" in result.stderr


def _now(db: Database) -> str:
    """The cluster time after everything ``db``'s client wrote, as ``--stop-at`` takes it."""
    ts = db.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    return f"{ts.time}:{ts.inc}"


def test_run_snapshots_then_streams_until_stop_at(tmp_path: Path, mongo_uri: str, fresh_db: Database) -> None:
    fresh_db.items.insert_many([{"_id": i, "v": i} for i in range(50)])
    config = _config(tmp_path, mongo_uri, fresh_db.name)
    out = tmp_path / "out"
    args = ["run", "--config", str(config), "--sink", f"jsonl:{out}", "--offsets", str(tmp_path / "offsets.json")]
    result = _mongocdc(*args, "--stop-at", _now(fresh_db), "--no-progress")
    assert result.returncode == 0, result.stderr
    topic = out / f"cli.{fresh_db.name}.items.jsonl"
    ops = [orjson.loads(line)["value"]["payload"]["op"] for line in topic.read_bytes().splitlines()]
    assert ops == ["r"] * 50
    assert "stopped: stop_at" in result.stderr
    fresh_db.items.update_one({"_id": 3}, {"$set": {"v": -3}})
    fresh_db.items.delete_one({"_id": 4})
    again = _mongocdc(*args, "--stop-at", _now(fresh_db), "--no-progress")
    assert again.returncode == 0, again.stderr
    values = [orjson.loads(line)["value"] for line in topic.read_bytes().splitlines()]
    assert [v["payload"]["op"] if v else None for v in values[50:]] == ["u", "d", None]  # None: the tombstone
    assert "mongocdc: streaming after" in result.stdout
    assert (tmp_path / "offsets.json").exists()


def test_sigterm_stops_gracefully_and_restart_continues(tmp_path: Path, mongo_uri: str, fresh_db: Database) -> None:
    fresh_db.items.insert_one({"_id": 0})
    config = _config(tmp_path, mongo_uri, fresh_db.name)
    out = tmp_path / "out"
    args = ["run", "--config", str(config), "--sink", f"jsonl:{out}", "--offsets", str(tmp_path / "offsets.json"), "--no-progress"]
    proc = subprocess.Popen([PY, "-m", "mongocdc_core.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "streaming" in proc.stdout.readline()
    fresh_db.items.insert_one({"_id": 1})
    topic = out / f"cli.{fresh_db.name}.items.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not topic.exists() or len(topic.read_bytes().splitlines()) < 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    fresh_db.items.insert_one({"_id": 2})
    result = _mongocdc(*args, "--stop-at", _now(fresh_db))
    assert result.returncode == 0, result.stderr
    ids = [orjson.loads(line)["key"]["payload"]["id"] for line in topic.read_bytes().splitlines()]
    assert ids == ["0", "1", "2"]  # a graceful stop repeats nothing and loses nothing


def test_bounds_are_checked_on_the_command_line(tmp_path: Path) -> None:
    config = _config(tmp_path, "mongodb://127.0.0.1:1/?replicaSet=rs0", "x")
    result = _mongocdc(
        "run", "--config", str(config), "--sink", f"jsonl:{tmp_path}/out", "--offsets", str(tmp_path / "o.json"),
        "--stop-at", "yesterday",
    )
    assert result.returncode == 2 and "SECONDS[:INCREMENT]" in result.stderr
    for bad in (["--max-events", "0"], ["--until-idle", "-1"]):
        result = _mongocdc(
            "run", "--config", str(config), "--sink", f"jsonl:{tmp_path}/out", "--offsets", str(tmp_path / "o.json"), *bad
        )
        assert result.returncode == 2 and bad[0] in result.stderr and "Traceback" not in result.stderr


def _unreachable_config(tmp_path: Path, **extra: str) -> tuple[Path, int]:
    port = free_port()  # nothing listens there
    settings = {
        "mongodb.server.selection.timeout.ms": "200",
        "connect.backoff.initial.delay.ms": "100",
        "connect.backoff.max.delay.ms": "200",
        **extra,
    }
    return _config(tmp_path, f"mongodb://127.0.0.1:{port}/?replicaSet=rs0", "x", **settings), port


def test_unreachable_mongodb_shows_the_connection_state_and_exits_3(tmp_path: Path) -> None:
    config, port = _unreachable_config(tmp_path, **{"connect.max.attempts": "2", "errors.max.retries": "0"})
    result = _mongocdc(
        "run", "--config", str(config), "--sink", f"jsonl:{tmp_path}/out", "--offsets", str(tmp_path / "o.json"),
        "--no-progress",
    )
    assert result.returncode == 3, result.stderr
    lines = [line for line in result.stderr.splitlines() if "mongocdc: connecting to" in line]
    assert len(lines) == 2, result.stderr
    for attempt, line in enumerate(lines, 1):
        assert f"127.0.0.1:{port} failed (" in line and f"reconnection attempt {attempt} of 2 in " in line
    assert "unreachable after 2 reconnection attempts" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("progress", [True, False], ids=["rich-progress", "no-progress"])
def test_sigint_while_connecting_stops_quietly(tmp_path: Path, progress: bool) -> None:
    config, _ = _unreachable_config(tmp_path)
    args = ["run", "--config", str(config), "--sink", f"jsonl:{tmp_path}/out", "--offsets", str(tmp_path / "o.json")]
    proc = subprocess.Popen(
        [PY, "-m", "mongocdc_core.cli", *args, *([] if progress else ["--no-progress"])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    seen = ""
    while "reconnection attempt" not in seen:
        line = proc.stderr.readline()
        assert line, f"exited before showing the connection state: {seen}"
        seen += line
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)  # a second signal while stopping
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, seen + err
    assert "Traceback" not in seen + err
    assert "SIGINT: stopping" in err and "stopped: stop" in err


def test_log_channel_notifications_are_shown(tmp_path: Path, mongo_uri: str, fresh_db: Database) -> None:
    fresh_db.items.insert_many([{"_id": i} for i in range(3)])
    fresh_db.signals.insert_one({"_id": "warmup"})
    signals = tmp_path / "signals.txt"
    signal_line = {"id": "s1", "type": "execute-snapshot",
                   "data": {"data-collections": [f"{fresh_db.name}.items"], "type": "incremental"}}
    signals.write_bytes(orjson.dumps(signal_line) + b"\n")
    config = _config(
        tmp_path, mongo_uri, fresh_db.name, **{
            "snapshot.mode": "no_data", "signal.data.collection": f"{fresh_db.name}.signals",
            "signal.enabled.channels": "source,file", "signal.file": str(signals),
            "signal.poll.interval.ms": "100", "notification.enabled.channels": "log",
        },
    )
    proc = subprocess.Popen(
        [PY, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", f"jsonl:{tmp_path}/out",
         "--offsets", str(tmp_path / "o.json"), "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    seen = ""
    while "COMPLETED" not in seen:  # the snapshot's last notification, shown by the log channel
        line = proc.stderr.readline()
        assert line, f"exited before the snapshot completed: {seen}"
        seen += line
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, seen + rest
    text = " ".join(seen.split())
    assert "Notification from" in text and "Incremental Snapshot" in text and "STARTED" in text


@pytest.mark.slow
def test_demo_rebuilds_the_source(tmp_path: Path) -> None:
    result = subprocess.run(
        [PY, "-m", "mongocdc_devstack.demo", "--home", str(tmp_path / "demo"), "--steps", "60"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rebuilds exactly the source collections" in result.stdout
    assert result.stdout.count("identical") == 3
    # Spark's start-up warnings and log lines are in the log file the demo names, not in its console
    spark_log = Path(next(line for line in result.stdout.splitlines()
                          if line.startswith("Spark's own log: ")).split(": ", 1)[1])
    assert spark_log.stat().st_size > 0, "Spark's output went to its log file"
    console = result.stdout + result.stderr
    assert "WARN" not in console and "log4j" not in console and "SLF4J" not in console, console
    # stderr is a pipe here: progress as log lines, never a bar or its control codes
    assert "\x1b[" not in result.stderr and "━" not in result.stderr, result.stderr
    assert "mongocdc.progress" in result.stderr, result.stderr
