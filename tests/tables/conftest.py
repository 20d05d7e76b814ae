"""One SparkSession for the whole tables test session (Spark start-up takes seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from mongocdc_core.tables.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = spark_session("local[2]", app_name="mongocdc-tables-tests")
    yield session
    session.stop()
