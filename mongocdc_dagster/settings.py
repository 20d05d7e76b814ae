"""Deployment settings read from the environment when the code location loads.

Dagster builds partitions and schedules when it imports the definitions, so the few settings that shape
them (slice granularity and start) are environment variables, read here and nowhere else.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from mongocdc_dagster import local_stack

ENV_CONFIG = "MONGOCDC_CONFIG"
ENV_HOME = "MONGOCDC_HOME"
ENV_GRANULARITY = "MONGOCDC_SLICE_GRANULARITY"
ENV_START = "MONGOCDC_SLICE_START"
ENV_SENSOR_INTERVAL = "MONGOCDC_SENSOR_INTERVAL"
ENV_KAFKA = "MONGOCDC_KAFKA_BOOTSTRAP"
ENV_PASSWORD = "MONGOCDC_MONGODB_PASSWORD"
ENV_SPARK_MASTER = "MONGOCDC_SPARK_MASTER"

DEFAULT_GRANULARITY = "hourly"
DEFAULT_START = "2026-01-01T00:00:00+00:00"
DEFAULT_SENSOR_INTERVAL = 30
_MINUTES = re.compile(r"^(\d+)min$")


class SettingsError(ValueError):
    """An environment variable holds a value the integration cannot use."""


@dataclass(frozen=True)
class Granularity:
    """A slice window size as Dagster partitions need it: a cron schedule and a key format."""

    name: str
    cron: str
    fmt: str
    seconds: int

    @classmethod
    def parse(cls, text: str) -> Granularity:
        """`hourly`, `daily`, or `<N>min` with N dividing 60 (e.g. `15min`, `1min`)."""
        value = text.strip().lower()
        if value == "hourly":
            return cls("hourly", "0 * * * *", "%Y-%m-%d-%H:%M", 3600)
        if value == "daily":
            return cls("daily", "0 0 * * *", "%Y-%m-%d", 86400)
        match = _MINUTES.match(value)
        if match and 1 <= int(match.group(1)) <= 60 and 60 % int(match.group(1)) == 0:
            minutes = int(match.group(1))
            cron = "* * * * *" if minutes == 1 else ("0 * * * *" if minutes == 60 else f"*/{minutes} * * * *")
            return cls(value, cron, "%Y-%m-%d-%H:%M", minutes * 60)
        raise SettingsError(
            f"{ENV_GRANULARITY}={text!r} is not a slice granularity; use hourly, daily or <N>min "
            "with N dividing 60 (e.g. 15min)"
        )


@dataclass(frozen=True)
class CdcSettings:
    """Where the connector config and local state are, and how stream slices are cut."""

    config_path: Path
    home: Path
    granularity: Granularity
    start: datetime
    sensor_interval_seconds: int
    kafka_bootstrap: str | None

    @property
    def landing_dir(self) -> Path:
        """The landing zone the assets write and the Spark tables read."""
        return self.home / "landing"

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> CdcSettings:
        """Read the settings; unset variables fall back to the local stack `make dev` starts."""
        env = dict(os.environ) if environ is None else environ
        start_text = env.get(ENV_START, DEFAULT_START)
        try:
            start = datetime.fromisoformat(start_text)
        except ValueError:
            raise SettingsError(f"{ENV_START}={start_text!r} is not an ISO date or date-time") from None
        if start.tzinfo is None:
            start = start.replace(tzinfo=UTC)
        interval_text = env.get(ENV_SENSOR_INTERVAL, str(DEFAULT_SENSOR_INTERVAL))
        if not interval_text.isdigit() or int(interval_text) < 1:
            raise SettingsError(f"{ENV_SENSOR_INTERVAL}={interval_text!r} must be a positive number of seconds")
        return cls(
            config_path=Path(env.get(ENV_CONFIG) or local_stack.DEFAULT_CONFIG).resolve(),
            home=Path(env.get(ENV_HOME) or local_stack.DEFAULT_HOME).resolve(),
            granularity=Granularity.parse(env.get(ENV_GRANULARITY, DEFAULT_GRANULARITY)),
            start=start.astimezone(UTC),
            sensor_interval_seconds=int(interval_text),
            kafka_bootstrap=env.get(ENV_KAFKA) or None,
        )
