"""Fixtures of the reliability trials: a source replica set of their own, and the figures they report."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from mongocdc_devstack.fixture import EmulatedReplicaSet
from tests.conftest import REAL_URI_ENV
from tests.kafka.conftest import kafka_bootstrap, kafka_broker  # noqa: F401 - the real broker, as tests/kafka has it
from tests.reliability.harness import Figures

RELIABILITY_PROPERTY = "reliability"


class Source:
    """The replica set a trial module captures: the real one under ``MONGOCDC_TEST_MONGODB_URI``, else an
    emulator in its own process (so the workload, the trial and the source do not share one interpreter)."""

    def __init__(self, uri: str, emulator: EmulatedReplicaSet | None) -> None:
        self.uri = uri
        self.emulator = emulator
        self.client: MongoClient[Any] = MongoClient(uri, serverSelectionTimeoutMS=30_000)  # UUIDs stay Binary

    def fresh_db(self) -> Any:
        return self.client[f"r_{uuid.uuid4().hex[:10]}"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Source]:
    real = os.environ.get(REAL_URI_ENV)
    if real:
        src = Source(real, None)
        yield src
        src.client.close()
        return
    dbpath = tmp_path_factory.mktemp("reliability-source")
    emulator = EmulatedReplicaSet(noop_interval=0.5, dbpath=str(dbpath), in_process=False, oplog_size_mb=512).start()
    src = Source(emulator.uri, emulator)
    try:
        src.client.admin.command("ping")
        yield src
    finally:
        src.client.close()
        emulator.stop()


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[Figures], None]:
    """Print a trial's figures and hand them to the session's reliability table (tests/conftest.py)."""

    def record(figures: Figures) -> None:
        print(f"\nRELIABILITY {figures.line()}")
        request.node.user_properties.append((RELIABILITY_PROPERTY, figures.to_json()))

    return record
