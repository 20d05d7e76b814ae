"""What one connector's Dagster definitions are called, so that several connectors load in one project.

The project's default connector (a component without ``name``) keeps the names mongocdc has always used
(resources ``mongocdc``, ``kafka`` and ``pyspark``; ``mongocdc_<what>`` for sensors, schedules, jobs, ops
and pools), so an existing deployment keeps its sensor cursors, schedule states and pool limits. A
connector named ``x`` gets the resources ``mongocdc_x``, ``mongocdc_x_kafka``, ``mongocdc_x_pyspark`` and
``mongocdc_x_<what>`` for everything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: What a connector name may be: it becomes part of Dagster names (letters, digits, underscores).
CONNECTOR_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class ConnectorNames:
    """The names of one connector's definitions; ``connector`` None is the project's default connector."""

    connector: str | None = None

    @property
    def mongocdc(self) -> str:
        """The MongoDB resource's key, and the prefix of every other name."""
        return "mongocdc" if self.connector is None else f"mongocdc_{self.connector}"

    @property
    def kafka(self) -> str:
        return "kafka" if self.connector is None else f"{self.mongocdc}_kafka"

    @property
    def pyspark(self) -> str:
        return "pyspark" if self.connector is None else f"{self.mongocdc}_pyspark"

    def of(self, what: str) -> str:
        """A sensor, schedule, job, op or pool name: ``mongocdc_<what>`` or ``mongocdc_<connector>_<what>``."""
        return f"{self.mongocdc}_{what}"


DEFAULT_NAMES = ConnectorNames()
