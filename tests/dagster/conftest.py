"""Fixtures for the Dagster tests: a connector over a fresh database, and a Dagster instance with a run queue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dagster import DagsterInstance, instance_for_test
from pymongo.database import Database

from tests.dagster.cdc_helpers import CdcEnv, make_env


@pytest.fixture
def cdc(tmp_path: Path, mongo_uri: str, fresh_db: Database[Any]) -> CdcEnv:
    fresh_db.create_collection("signals")
    return make_env(tmp_path, mongo_uri, fresh_db)


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test(overrides={
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"},
    }) as inst:
        yield inst
