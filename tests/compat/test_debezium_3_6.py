"""The compatibility suite (:mod:`tests.compat.compat_suite`) against Debezium 3.6."""

import pytest

from tests.compat.compat_suite import *  # noqa: F403 - the suite's tests run here for this version
from tests.compat.debezium import pinned


@pytest.fixture
def debezium_version() -> str:
    return pinned("3.6")
