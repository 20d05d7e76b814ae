"""Source faults under load: step-downs, dropped connections, failCommand, delays, blocked getMores,
and the replica set restarted (cleanly, or killed and recovered from its journal).

The connector (``mongocdc run``, JSON Lines) runs through every fault without exiting; once the fault is
over a marker document is written, and the time from the end of the fault until the connector
delivered the marker is the recovery time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pymongo.errors import PyMongoError

from tests.engine.engine_support import source_state
from tests.reliability.conftest import Source
from tests.reliability.harness import (
    FULL,
    Connector,
    Figures,
    JsonlWatcher,
    Workload,
    cluster_time,
    compare,
    connector_properties,
    ground_truth,
    insert_retrying,
    read_jsonl,
    scale,
    stop_at_arg,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.reliability, pytest.mark.fault]


def _admin(source: Source, *args: Any, **kwargs: Any) -> None:
    """An admin command whose connection the fault itself may close (as mongod does)."""
    try:
        source.client.admin.command(*args, **kwargs)
    except PyMongoError:
        pass


def _fail_point(source: Source, data: dict[str, Any], times: int, hold_s: float = 0.0) -> None:
    source.client.admin.command("configureFailPoint", "failCommand", mode={"times": times}, data=data)
    time.sleep(hold_s)


def step_down(source: Source) -> None:
    _admin(source, "replSetStepDown", 1, force=True, secondaryCatchUpPeriodSecs=0)


def step_down_twice(source: Source) -> None:
    step_down(source)
    time.sleep(2.0)
    step_down(source)


def drop_connections(source: Source) -> None:
    _admin(source, "mongocdcDropConnections")


def resumable_getmore_errors(source: Source) -> None:
    _fail_point(source, {"failCommands": ["getMore", "aggregate"], "errorCode": 11602,
                         "errorLabels": ["ResumableChangeStreamError"]}, times=5, hold_s=1.0)


def getmore_connection_closed(source: Source) -> None:
    _fail_point(source, {"failCommands": ["getMore"], "closeConnection": True}, times=3, hold_s=1.0)


def host_unreachable_on_resume(source: Source) -> None:
    _fail_point(source, {"failCommands": ["getMore", "aggregate"], "errorCode": 6}, times=4, hold_s=1.0)


def blocked_getmore(source: Source) -> None:
    _fail_point(source, {"failCommands": ["getMore"], "blockConnection": True, "blockTimeMS": 3000}, times=1,
                hold_s=3.5)


def delayed_replies(source: Source) -> None:
    _admin(source, "mongocdcDelayReplies", ms=1500)
    time.sleep(4.0)
    _admin(source, "mongocdcDelayReplies", ms=0)


def restart(source: Source) -> None:
    assert source.emulator is not None
    source.emulator.stop()
    time.sleep(scale(2, 8))
    source.emulator.start()


def crash_and_recover(source: Source) -> None:
    assert source.emulator is not None
    source.emulator.kill()
    time.sleep(scale(2, 8))
    source.emulator.start()


SCENARIOS: list[tuple[str, Callable[[Source], None], bool]] = [  # (name, fault, part of the small run)
    ("step-down", step_down, True),
    ("step-down twice", step_down_twice, False),
    ("dropped connections", drop_connections, False),
    ("failCommand: resumable getMore errors", resumable_getmore_errors, False),
    ("failCommand: getMore connection closed", getmore_connection_closed, False),
    ("failCommand: HostUnreachable on resume", host_unreachable_on_resume, False),
    ("failCommand: getMore blocked 3 s", blocked_getmore, False),
    ("delayed replies (1.5 s each for 4 s)", delayed_replies, False),
    ("source restarted", restart, True),
    ("source killed -9, recovered from its journal", crash_and_recover, False),
]


@pytest.mark.parametrize(
    "fault", [f for name, f, small in SCENARIOS if small or FULL],
    ids=[name for name, _, small in SCENARIOS if small or FULL],
)
def test_source_fault_under_load(
    source: Source, tmp_path: Path, fault: Callable[[Source], None], report: Callable[[Figures], None]
) -> None:
    name = next(n for n, f, _ in SCENARIOS if f is fault)
    db = source.fresh_db()
    db.load.insert_many([{"_id": -1 - i} for i in range(50)])
    out = tmp_path / "out"
    config = write_config(tmp_path / "connector.json", connector_properties(source.uri, db.name))
    connector = Connector(config, f"jsonl:{out}", str(tmp_path / "offsets.json"), tmp_path)
    connector.start()
    connector.wait_streaming()
    start = cluster_time(source.client)
    workload = Workload(db.load, seed=hash(name) % 10_000)
    steps = scale(300, 3000)
    workload.run(steps // 3, pause_s=0.003)
    writer = workload.in_background(steps - steps // 3, pause_s=0.003)
    fault(source)
    fault_over = time.monotonic()
    marker = f"marker-{name}"
    insert_retrying(db.load, {"_id": marker})
    watcher = JsonlWatcher(out / f"rel.{db.name}.load.jsonl")
    wait_until(lambda: watcher.delivered(marker), 180, f"{name}: marker delivered")
    recovery = time.monotonic() - fault_over
    writer.join()
    assert connector.running(), connector.tail()  # recovered in place
    stop = cluster_time(source.client)
    assert connector.terminate() == 0, connector.tail()
    assert connector.run("--stop-at", stop_at_arg(stop)) == 0, connector.tail()
    delivered = read_jsonl(out / f"rel.{db.name}.load.jsonl")
    figures = compare(
        f"source fault: {name}", ground_truth(db, "load", start, stop), delivered.events(start, stop),
        delivered.rebuilt(f"{db.name}.load"), source_state(db.load),
        recovery_s=recovery, peak_rss_mb=connector.peak_rss_mb,
    )
    report(figures)
    source.client.drop_database(db.name)
    assert figures.lost == 0 and figures.mismatch == 0 and "unexpected" not in figures.note, figures.line()
    assert delivered.torn == 0
