"""The ``mongocdc`` command and ``make demo``'s module, run as a user would: as subprocesses."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from pymongo.database import Database

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


def test_run_snapshots_then_streams_until_idle(tmp_path: Path, mongo_uri: str, fresh_db: Database) -> None:
    fresh_db.items.insert_many([{"_id": i, "v": i} for i in range(50)])
    config = _config(tmp_path, mongo_uri, fresh_db.name)
    out = tmp_path / "out"
    result = _mongocdc(
        "run", "--config", str(config), "--sink", f"jsonl:{out}", "--offsets", str(tmp_path / "offsets.json"),
        "--until-idle", "2", "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    lines = (out / f"cli.{fresh_db.name}.items.jsonl").read_bytes().splitlines()
    ops = [orjson.loads(line)["value"]["payload"]["op"] for line in lines]
    assert ops == ["r"] * 50
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
    result = _mongocdc(*args, "--until-idle", "2")
    assert result.returncode == 0, result.stderr
    ids = [orjson.loads(line)["key"]["payload"]["id"] for line in topic.read_bytes().splitlines()]
    assert ids == ["0", "1", "2"]  # a graceful stop repeats nothing and loses nothing


@pytest.mark.slow
def test_demo_rebuilds_the_source(tmp_path: Path) -> None:
    result = subprocess.run(
        [PY, "-m", "mongocdc_devstack.demo", "--home", str(tmp_path / "demo"), "--steps", "60"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rebuilds exactly the source collections" in result.stdout
    assert result.stdout.count("identical") == 3
