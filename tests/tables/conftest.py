"""One SparkSession for the whole tables test session (Spark start-up takes seconds)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from mongocdc_core.tables.session import spark_session
from mongocdc_devstack.kafka_broker import KafkaBroker, KafkaBrokerError, find_jars


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", app_name="mongocdc-tables-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real single-node broker (same set-up as tests/kafka/conftest.py, which this directory cannot import)."""
    try:
        jars_dir = find_jars()
    except KafkaBrokerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the Kafka jars are missing: {exc}", pytrace=False)
        pytest.skip(f"Kafka jars missing: {exc}")
    with KafkaBroker(None, tmp_path_factory.mktemp("kafka-broker"), jars_dir) as broker:
        yield broker.bootstrap_servers
