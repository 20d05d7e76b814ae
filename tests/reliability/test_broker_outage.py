"""The Kafka broker goes away under load and comes back: nothing lost, memory bounded by the queues.

While the broker is down the connector keeps its records in a bounded local queue and blocks the
stream (it does not exit, drop records or grow without limit); when the broker returns it delivers
everything, in order per key. Peak RSS is the connector process's over the whole outage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from mongocdc_devstack.kafka_broker import KafkaBroker
from tests.engine.engine_support import source_state
from tests.kafka.kafka_support import read_topic
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
    insert_retrying,
    key_of,
    scale,
    stop_at_arg,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.reliability


def test_broker_outage_under_load(
    source: Source, tmp_path: Path, kafka_broker: KafkaBroker, report: Callable[[Figures], None]
) -> None:
    bootstrap = kafka_broker.bootstrap_servers
    db = source.fresh_db()
    db.load.insert_many([{"_id": -1 - i} for i in range(50)])
    props = connector_properties(source.uri, db.name, **{"max.queue.size": 2048, "max.batch.size": 256})
    connector = Connector(write_config(tmp_path / "connector.json", props), f"kafka:{bootstrap}",
                          str(tmp_path / "offsets.json"), tmp_path)
    connector.start()
    connector.wait_streaming()
    start = cluster_time(source.client)
    workload = Workload(db.load, seed=90)
    steps = scale(1500, 20000)
    outage_s = scale(10, 90)
    writer = workload.in_background(steps, pause_s=outage_s / steps)  # the load spans the outage
    time.sleep(1.0)
    kafka_broker.stop()
    try:
        time.sleep(outage_s)
        assert connector.running(), connector.tail()  # blocked, alive
    finally:
        kafka_broker.start()
    back = time.monotonic()
    marker = "marker-after-outage"
    insert_retrying(db.load, {"_id": marker})
    topic = f"rel.{db.name}.load"

    def marker_delivered() -> bool:
        return key_of(marker) in {orjson.loads(k)["id"] for _, k, _ in read_topic(bootstrap, topic) if k}

    wait_until(marker_delivered, 300, "the marker reached Kafka", interval=1.0)
    recovery = time.monotonic() - back
    writer.join()
    stop = cluster_time(source.client)
    assert connector.terminate() == 0, connector.tail()
    assert connector.run("--stop-at", stop_at_arg(stop)) == 0, connector.tail()
    delivered = Delivered([(k or b"null", v) for _, k, v in read_topic(bootstrap, topic)])
    figures = compare(
        f"Kafka broker down {outage_s}s under load", ground_truth(db, "load", start, stop),
        delivered.events(start, stop), delivered.rebuilt(f"{db.name}.load"), source_state(db.load),
        recovery_s=recovery, peak_rss_mb=connector.peak_rss_mb,
    )
    figures.note += f" writes={workload.writes}"
    report(figures)
    source.client.drop_database(db.name)
    assert figures.lost == 0 and figures.mismatch == 0 and "unexpected" not in figures.note, figures.line()
