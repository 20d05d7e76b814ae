"""kill -9 at random points while a workload runs: nothing lost, nothing torn, the same final state.

JSON Lines is at-least-once (events after the last saved offset are delivered again, and counted as
duplicated); Kafka with ``mongocdc.kafka.exactly.once=true`` read ``read_committed`` has no duplicate.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engine.engine_support import source_state
from tests.reliability.conftest import Source
from tests.reliability.harness import (
    Connector,
    Delivered,
    Figures,
    Workload,
    cluster_time,
    compare,
    connector_properties,
    ground_truth,
    read_jsonl,
    scale,
    stop_at_arg,
    write_config,
)

pytestmark = pytest.mark.reliability


def _kill_while_writing(connector: Connector, workload: Workload, steps: int, kills: int, seed: int) -> list[float]:
    """Run the workload; meanwhile kill -9 the connector ``kills`` times at random moments and restart it.

    Returns the seconds each restart took to stream again.
    """
    rng = random.Random(seed)
    writer = workload.in_background(steps, pause_s=scale(10, 2) / 1000)
    recoveries = []
    for _ in range(kills):
        time.sleep(rng.uniform(0.1, 1.5))
        connector.kill9()
        connector.start()
        recoveries.append(connector.wait_streaming())
    writer.join()
    return recoveries


def _trial(
    name: str, source: Source, tmp_path: Path, sink: str, offsets: str, read: Callable[[str], Delivered],
    extra: dict[str, object], seed: int,
) -> tuple[Figures, Delivered, int]:
    db = source.fresh_db()
    db.load.insert_many([{"_id": -1 - i, "seed": True} for i in range(scale(100, 2000))])  # the snapshot's part
    props = connector_properties(source.uri, db.name, **extra)
    connector = Connector(write_config(tmp_path / "connector.json", props), sink, offsets, tmp_path)
    connector.start()
    connector.wait_streaming()
    start = cluster_time(source.client)
    workload = Workload(db.load, seed)
    kills = scale(2, 19)
    recoveries = _kill_while_writing(connector, workload, scale(600, 20000), kills, seed)
    stop = cluster_time(source.client)
    assert connector.terminate() == 0, connector.tail()
    code = connector.run("--stop-at", stop_at_arg(stop))  # the last restart delivers up to the last write
    topic = f"rel.{db.name}.load"
    delivered = read(topic)
    truth = ground_truth(db, "load", start, stop)
    figures = compare(
        name, truth, delivered.events(start, stop), delivered.rebuilt(f"{db.name}.load"),
        source_state(db.load),
        recovery_s=max(recoveries), peak_rss_mb=connector.peak_rss_mb,
    )
    figures.note += f" writes={workload.writes} kills={kills} torn={delivered.torn}"
    source.client.drop_database(db.name)
    return figures, delivered, code


def test_kill_9_at_random_points_with_json_lines(source: Source, tmp_path: Path,
                                                 report: Callable[[Figures], None]) -> None:
    out = tmp_path / "out"
    figures, delivered, code = _trial(
        "kill -9 x JSON Lines", source, tmp_path, f"jsonl:{out}", str(tmp_path / "offsets.json"),
        lambda topic: read_jsonl(out / f"{topic}.jsonl"), {}, seed=1914,
    )
    report(figures)
    assert code == 0
    assert figures.lost == 0 and figures.mismatch == 0 and delivered.torn == 0, figures.line()
    assert "unexpected" not in figures.note, figures.line()


def test_kill_9_at_random_points_with_kafka_exactly_once(source: Source, tmp_path: Path, kafka_bootstrap: str,
                                                         report: Callable[[Figures], None]) -> None:
    from tests.kafka.kafka_support import read_topic

    def read(topic: str) -> Delivered:
        return Delivered([(k or b"null", v) for _, k, v in read_topic(kafka_bootstrap, topic, committed=True)])

    figures, _, code = _trial(
        "kill -9 x Kafka exactly-once (read_committed)", source, tmp_path, f"kafka:{kafka_bootstrap}",
        f"kafka:{kafka_bootstrap}/offsets-{uuid.uuid4().hex[:8]}", read,
        {"mongocdc.kafka.exactly.once": "true", "name": f"eos-{uuid.uuid4().hex[:8]}"}, seed=1219,
    )
    report(figures)
    assert code == 0
    assert figures.lost == 0 and figures.duplicated == 0 and figures.mismatch == 0, figures.line()
    assert "unexpected" not in figures.note, figures.line()
