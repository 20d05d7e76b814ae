"""A multi-range snapshot stopped at a random point (SIGTERM or kill -9) resumes with what is left.

The connector runs as users run it (``mongocdc run`` in its own process, JSON Lines sink, offset
file). Facts decide: every document is read at least once after the restart; after SIGTERM none
twice; after kill -9 at most the ranges that were being copied repeat.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

REPO = Path(__file__).resolve().parents[2]
TOTAL, SPLIT, THREADS = 3000, 300, 3


def _config(tmp_path: Path, uri: str, db: str) -> Path:
    path = tmp_path / "connector.json"
    path.write_bytes(orjson.dumps({"name": "resume", "config": {
        "mongodb.connection.string": uri,
        "topic.prefix": "srv",
        "collection.include.list": f"{db}\\.big",
        "snapshot.mode": "initial_only",
        "snapshot.max.threads": str(THREADS),
        "snapshot.fetch.size": "50",
        "mongocdc.snapshot.split.size": str(SPLIT),
        "offset.flush.interval.ms": "600000",  # only finished ranges and stops record progress
        "mongocdc.schemas.enable": "false",
    }}))
    return path


def _run(config: Path, out: Path, offsets: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", f"jsonl:{out}",
         "--offsets", str(offsets)],
        cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


def _read_ids(path: Path) -> list[Any]:
    if not path.exists():
        return []
    ids = []
    for line in path.read_bytes().splitlines():
        value = orjson.loads(line)["value"]
        if value is not None and value["op"] == "r":
            ids.append(orjson.loads(value["after"])["_id"])
    return ids


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "kill9"])
def test_multi_range_snapshot_interrupted_at_a_random_point_resumes(
    fresh_db: Any, mongo_uri: str, tmp_path: Path, sig: signal.Signals, seed: int
) -> None:
    half = TOTAL // 2
    fresh_db.big.insert_many([{"_id": i, "pad": "x" * 200} for i in range(half)]
                             + [{"_id": f"s{i:05d}", "pad": "y" * 200} for i in range(half)])
    config, out, offsets = _config(tmp_path, mongo_uri, fresh_db.name), tmp_path / "out", tmp_path / "offsets.json"
    landing = out / f"srv.{fresh_db.name}.big.jsonl"
    threshold = random.Random(seed).randint(TOTAL // 10, TOTAL * 9 // 10)

    proc = _run(config, out, offsets)
    deadline = time.monotonic() + 120
    while _lines(landing) < threshold and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert proc.poll() is None, f"the snapshot ended before the stop at {threshold} records: make it larger"
    os.kill(proc.pid, sig)
    code = proc.wait(60)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if sig == signal.SIGTERM:
        assert code == 0 and "Traceback" not in stderr, stderr
    before = len(_read_ids(landing))

    restart = _run(config, out, offsets)
    assert restart.wait(180) == 0, restart.stderr.read().decode() if restart.stderr else ""
    ids = _read_ids(landing)
    keys = [orjson.dumps(i) for i in ids]
    expected = {orjson.dumps(i) for i in [*range(half), *(f"s{i:05d}" for i in range(half))]}
    assert set(keys) == expected, "a document was lost"
    duplicates = len(keys) - len(set(keys))
    if sig == signal.SIGTERM:
        assert duplicates == 0, f"{duplicates} documents read twice after a graceful stop at {before} records"
    else:
        # Only ranges that were being copied when the process died can repeat.
        assert duplicates <= THREADS * SPLIT, f"{duplicates} repeated after kill -9 at {before} records"
