"""Bad input against the real command and a running connector: one clear line, never a traceback.

Malformed configurations (the corpus of ``tests/core/test_bad_input.py``, at least 60) go through
``mongocdc run`` as real processes: each must exit 2 before anything starts, naming the property.
Malformed signals (at least 30) are sent to a running connector through the signaling collection and
the file channel: each must be rejected with a notification, and the connector must keep streaming.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.core.test_bad_input import BASE, CONFIGS, MESSAGE_LIMIT, SIGNALS
from tests.reliability.conftest import Source
from tests.reliability.harness import (
    FULL,
    REPO,
    Connector,
    Figures,
    JsonlWatcher,
    connector_properties,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.reliability
SMALL_SAMPLE = ("uri-unknown-option", "snapshot-list-outside-captured", "huge-enum-value")


def _config_file(tmp_path: Path, case: str, props: Mapping[str, str | None], as_properties: bool) -> Path:
    merged: dict[str, str] = dict(BASE)
    for key, value in props.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    if as_properties:
        path = tmp_path / f"{case}.properties"
        path.write_text("".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in merged.items()))
    else:
        path = tmp_path / f"{case}.json"
        path.write_text(json.dumps({"name": "shop", "config": merged}))
    return path


@pytest.mark.timeout(1800)  # the full corpus is some 70 processes
def test_malformed_configs_through_the_real_command(tmp_path: Path, report: Callable[[Figures], None]) -> None:
    # All of them run in-process in tests/core (and four of them as processes); a sample here.
    cases = CONFIGS if FULL else [c for c in CONFIGS if c[0] in SMALL_SAMPLE]
    refused = tracebacks = started = 0
    longest = 0
    failures = []
    for index, (case, props, named) in enumerate(cases):
        config = _config_file(tmp_path, case, props, as_properties=index % 2 == 1 and "huge" not in case)
        out, offsets = tmp_path / f"out-{case}", tmp_path / f"offsets-{case}.json"
        result = subprocess.run(
            [sys.executable, "-m", "mongocdc_core.cli", "run", "--config", str(config), "--sink", f"jsonl:{out}",
             "--offsets", str(offsets), "--no-progress"], capture_output=True, text=True, timeout=120, cwd=REPO,
        )
        output = result.stdout + result.stderr
        longest = max(longest, len(output))
        ok = result.returncode == 2 and named in output
        refused += ok
        tracebacks += "Traceback" in output
        started += out.exists() or offsets.exists()
        if not ok or "Traceback" in output:
            failures.append(f"{case}: exit {result.returncode}: {output[:500]}")
    report(Figures("malformed configurations via mongocdc run",
                   note=f"{refused}/{len(cases)} refused with exit 2 naming the property, tracebacks={tracebacks}, "
                        f"started={started}, longest output={longest} chars"))
    assert not failures, "\n".join(failures)
    assert tracebacks == 0 and started == 0 and longest < MESSAGE_LIMIT


def test_malformed_signals_into_a_running_connector(source: Source, tmp_path: Path,
                                                    report: Callable[[Figures], None]) -> None:
    db = source.fresh_db()
    db.signals.insert_one({"_id": "warmup"})
    out = tmp_path / "out"
    signal_file = tmp_path / "signals.txt"
    props = connector_properties(source.uri, db.name, **{
        "signal.data.collection": f"{db.name}.signals", "signal.enabled.channels": "source,file",
        "signal.file": str(signal_file), "signal.poll.interval.ms": 100,
        "notification.enabled.channels": "sink,log", "notification.sink.topic.name": "rel-notifications",
    })
    connector = Connector(write_config(tmp_path / "connector.json", props), f"jsonl:{out}",
                          str(tmp_path / "offsets.json"), tmp_path)
    connector.start()
    connector.wait_streaming()
    documents = [(case, doc) for case, doc, _ in SIGNALS if not isinstance(doc, str)]
    texts = [doc for _, doc, _ in SIGNALS if isinstance(doc, str)]
    for case, doc in documents:
        db.signals.insert_one({**doc, "_id": f"bad-{case}"})
    signal_file.write_text("".join(line + "\n" for line in texts))
    notes = JsonlNotifications(out / "rel-notifications.jsonl")
    wait_until(lambda: notes.rejected() >= len(SIGNALS), 180, "every bad signal rejected", interval=0.2)
    db.load.insert_one({"_id": "after-the-signals"})
    watcher = JsonlWatcher(out / f"rel.{db.name}.load.jsonl")
    wait_until(lambda: watcher.delivered("after-the-signals"), 60, "the stream went on")
    alive = connector.running()
    assert connector.terminate() == 0, connector.tail()
    output = connector.output()
    longest = max(len(line) for line in output.splitlines())
    largest = max(len(line) for line in (out / "rel-notifications.jsonl").read_bytes().splitlines())
    report(Figures("malformed signals into a running connector", peak_rss_mb=connector.peak_rss_mb,
                   note=f"{notes.rejected()}/{len(SIGNALS)} rejected with a notification, kept streaming={alive}, "
                        f"longest log line={longest} chars, largest notification={largest} bytes"))
    source.client.drop_database(db.name)
    assert alive and notes.rejected() == len(SIGNALS) and notes.accepted() == 0
    assert "Traceback" not in output and longest < MESSAGE_LIMIT and largest < MESSAGE_LIMIT


class JsonlNotifications:
    """Signal notifications a JSON Lines sink received."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _signals(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_bytes().splitlines():
            value = orjson.loads(line)["value"]
            payload = value.get("payload", value)
            if payload.get("aggregate_type") == "Signal":
                out.append(payload)
        return out

    def rejected(self) -> int:
        return sum(1 for n in self._signals() if n["type"] == "REJECTED")

    def accepted(self) -> int:
        return sum(1 for n in self._signals() if n["type"] != "REJECTED")
