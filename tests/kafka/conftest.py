"""A real single-node Kafka broker (KRaft) shared by the whole test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from mongocdc_devstack.kafka_broker import KafkaBroker, KafkaBrokerError, find_jars


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One broker on a free loopback port for the session.

    Missing jars skip the Kafka tests on a developer machine that has not run ``make setup``; under CI
    (env ``CI`` set) they are a failure, so a broken setup can never pass as "all skipped".
    """
    try:
        jars_dir = find_jars()
    except KafkaBrokerError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the Kafka jars are missing: {exc}", pytrace=False)
        pytest.skip(f"Kafka jars missing: {exc}")
    with KafkaBroker(None, tmp_path_factory.mktemp("kafka-broker"), jars_dir) as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaBroker) -> str:
    """``bootstrap.servers`` of the session broker (stable across restarts of that broker)."""
    return kafka_broker.bootstrap_servers
