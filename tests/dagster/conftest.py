"""Fixtures for the Dagster tests: a database with a signaling collection, and a Dagster instance with a run queue."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dagster import DagsterInstance, instance_for_test
from pymongo.database import Database


@pytest.fixture
def db(fresh_db: Database[Any]) -> Database[Any]:
    fresh_db.create_collection("signals")
    return fresh_db


@pytest.fixture
def instance() -> Iterator[DagsterInstance]:
    with instance_for_test(overrides={
        "run_coordinator": {"module": "dagster._core.run_coordinator", "class": "QueuedRunCoordinator"},
    }) as inst:
        yield inst
