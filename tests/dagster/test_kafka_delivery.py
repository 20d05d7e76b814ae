"""With the kafka resource configured, a snapshot run lands its Parquet file AND publishes the same records."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from dagster import AssetsDefinition, DagsterInstance, materialize
from pymongo.database import Database

from mongocdc_dagster.resources import MongoCdcKafkaResource
from mongocdc_devstack.kafka_broker import KafkaBroker, KafkaBrokerError, find_jars
from tests.dagster.cdc_helpers import make_env, materialization_metadata


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real single-node broker; missing jars skip locally and fail under CI (as tests/kafka does)."""
    try:
        jars_dir = find_jars()
    except KafkaBrokerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the Kafka jars are missing: {exc}", pytrace=False)
        pytest.skip(f"Kafka jars missing: {exc}")
    with KafkaBroker(None, tmp_path_factory.mktemp("kafka"), jars_dir) as broker:
        yield broker.bootstrap_servers


def _keys(bootstrap: str, topic: str) -> list[str]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4().hex[:8]}",
                         "enable.partition.eof": True, "enable.auto.commit": False})
    keys: list[str] = []
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        pending = set(meta.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                assert error.code() == KafkaError._PARTITION_EOF, error
                pending.discard(msg.partition())
                continue
            raw = msg.key()
            assert raw is not None
            key = orjson.loads(raw)
            payload = key["payload"] if "schema" in key else key  # with or without the Connect JSON schema
            keys.append(orjson.dumps(payload).decode())
    finally:
        consumer.close()
    return keys


def test_snapshot_publishes_to_kafka_and_lands_parquet(tmp_path: Path, mongo_uri: str, db: Database[Any],
                                                      instance: DagsterInstance, bootstrap: str) -> None:
    db.parts.insert_many([{"_id": i, "n": i} for i in range(8)])
    env = make_env(tmp_path, mongo_uri, db, ["parts"], tables=False)  # snapshots only: no Spark needed
    key = env.key("parts", "snapshot")
    resources = {**env.resources, "kafka": MongoCdcKafkaResource(bootstrap_servers=bootstrap)}
    assets = [a for a in env.defs.assets or [] if isinstance(a, AssetsDefinition)]
    assert materialize(assets, selection=[key], resources=resources, instance=instance).success
    path = Path(materialization_metadata(instance, key)["dagster/uri"])
    landed = sorted(pq.read_table(path)["key"].to_pylist())
    assert sorted(_keys(bootstrap, f"testsrv.{env.ns('parts')}")) == landed and len(landed) == 8
