"""What one mongocdc deployment in Dagster is configured with, and where unset values come from.

The component's ``defs.yaml`` attributes are the way to configure it; an attribute left out falls
back to an environment variable, and then to the local stack ``make dev`` starts. Everything that
shapes definitions (slice windows, which collections are split into ranges) is read here and
nowhere else.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from mongocdc_core.config import ConnectorConfig
from mongocdc_dagster.naming import CONNECTOR_NAME, ConnectorNames

ENV_CONFIG = "MONGOCDC_CONFIG"
ENV_HOME = "MONGOCDC_HOME"
ENV_GRANULARITY = "MONGOCDC_SLICE_GRANULARITY"
ENV_START = "MONGOCDC_SLICE_START"
ENV_SENSOR_INTERVAL = "MONGOCDC_SENSOR_INTERVAL"
ENV_KAFKA = "MONGOCDC_KAFKA_BOOTSTRAP"
ENV_PASSWORD = "MONGOCDC_MONGODB_PASSWORD"
ENV_SPARK_MASTER = "MONGOCDC_SPARK_MASTER"
ENV_TABLES = "MONGOCDC_TABLES_ENABLED"

DEFAULT_GRANULARITY = "hourly"
DEFAULT_SENSOR_INTERVAL = 30
DEFAULT_SPARK_MASTER = "local[2]"
#: With no start configured, windows begin where the oplog begins, but never more than this many windows
#: back: a window the oplog no longer holds can only be read from a snapshot, so older ones are useless.
MAX_DEFAULT_WINDOWS = 2000
_MINUTES = re.compile(r"^(\d+)min$")


class SettingsError(ValueError):
    """A setting holds a value the integration cannot use; the message names it."""


@dataclass(frozen=True)
class Granularity:
    """A slice window size as Dagster partitions need it: a cron schedule and a key format."""

    name: str
    cron: str
    fmt: str
    seconds: int

    @classmethod
    def parse(cls, text: str, source: str = ENV_GRANULARITY) -> Granularity:
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
            f"{source}={text!r} is not a slice granularity; use hourly, daily or <N>min with N dividing 60 (e.g. 15min)"
        )


def parse_start(text: str, source: str = ENV_START) -> datetime:
    """An ISO date or date-time (UTC when no zone is given)."""
    try:
        start = datetime.fromisoformat(text)
    except ValueError:
        raise SettingsError(f"{source}={text!r} is not an ISO date or date-time") from None
    if start.tzinfo is None:
        start = start.replace(tzinfo=UTC)
    return start.astimezone(UTC)


@dataclass(frozen=True)
class CdcSettings:
    """One connector's deployment: its config, its home (landing zone, tables), and how slices are cut.

    ``config_path`` or ``properties`` names the connector (Debezium properties, as `mongocdc run`
    takes them); ``start`` None lets the windows start where the oplog starts (see
    :data:`MAX_DEFAULT_WINDOWS`). ``ranged`` maps a collection to the documents per range its
    snapshot is split into, each range a partition of its own. ``name`` names the connector's definitions
    when a project has several (None: the default connector, see :mod:`mongocdc_dagster.naming`).
    """

    home: Path
    granularity: Granularity
    config_path: Path | None = None
    properties: Mapping[str, str] | None = None
    start: datetime | None = None
    sensor_interval_seconds: int = DEFAULT_SENSOR_INTERVAL
    kafka_bootstrap: str | None = None
    tables: bool = True
    spark_master: str = DEFAULT_SPARK_MASTER
    ranged: Mapping[str, int] = field(default_factory=dict)
    name: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None and not CONNECTOR_NAME.match(self.name):
            raise SettingsError(f"name={self.name!r} must be lower-case letters, digits and underscores, starting "
                                "with a letter (it becomes part of the connector's resource, job and pool names)")
        if self.name == "mongocdc":
            raise SettingsError("name='mongocdc' is what the project's default connector (a component without `name`) "
                                "is called; give this connector another name")
        if (self.config_path is None) == (self.properties is None):
            raise SettingsError("name the connector with exactly one of connector_config (a file) or "
                                "connector_properties (inline Debezium properties)")
        for namespace, size in self.ranged.items():
            if "." not in namespace or size < 1:
                raise SettingsError(f"ranged_snapshots: {namespace!r}: {size} must map '<db>.<collection>' to a "
                                    "positive number of documents per range")

    @property
    def names(self) -> ConnectorNames:
        """What this connector's resources, sensors, schedules, jobs, ops and pools are called."""
        return ConnectorNames(self.name)

    @property
    def landing_dir(self) -> Path:
        """The landing zone the assets write and the Spark tables read."""
        return self.home / "landing"

    @property
    def tables_root(self) -> str:
        return str(self.home / "tables")

    def load_config(self) -> ConnectorConfig:
        """The connector config these settings name (validated)."""
        if self.config_path is not None:
            return ConnectorConfig.load(self.config_path)
        assert self.properties is not None
        return ConnectorConfig.from_dict(dict(self.properties))

    @classmethod
    def resolve(
        cls,
        *,
        connector_config: str | None = None,
        connector_properties: Mapping[str, str] | None = None,
        home: str | None = None,
        slice_granularity: str | None = None,
        slice_start: str | None = None,
        sensor_interval_seconds: int | None = None,
        kafka_bootstrap: str | None = None,
        tables: bool | None = None,
        spark_master: str | None = None,
        ranged_snapshots: Mapping[str, int] | None = None,
        name: str | None = None,
        environ: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
    ) -> CdcSettings:
        """Settings from explicit values; each one left None falls back to its environment variable,
        then to the local stack. Relative paths are taken from ``base_dir`` (the defs.yaml folder)."""
        # Imported here, not with the package: `python -m mongocdc_dagster.local_stack` must find the module
        # not yet imported (runpy warns otherwise), and the package's import chain reaches this module.
        from mongocdc_dagster import local_stack

        env = dict(os.environ) if environ is None else dict(environ)

        def path(text: str) -> Path:
            p = Path(text).expanduser()
            return (p if p.is_absolute() or base_dir is None else base_dir / p).resolve()

        config_path: Path | None = None
        if connector_properties is None:
            config_path = path(connector_config) if connector_config else Path(
                env.get(ENV_CONFIG) or local_stack.DEFAULT_CONFIG).resolve()
        elif connector_config:
            raise SettingsError("set connector_config or connector_properties, not both")
        interval = sensor_interval_seconds
        if interval is None:
            text = env.get(ENV_SENSOR_INTERVAL, str(DEFAULT_SENSOR_INTERVAL))
            if not text.isdigit() or int(text) < 1:
                raise SettingsError(f"{ENV_SENSOR_INTERVAL}={text!r} must be a positive number of seconds")
            interval = int(text)
        if interval < 1:
            raise SettingsError(f"sensor_interval_seconds={interval} must be a positive number of seconds")
        start_text = slice_start if slice_start is not None else env.get(ENV_START)
        tables_text = env.get(ENV_TABLES, "true").strip().lower()
        if tables is None and tables_text not in ("true", "false", "1", "0"):
            raise SettingsError(f"{ENV_TABLES}={tables_text!r} must be true or false")
        return cls(
            # a named connector without a home of its own lands and builds under <home>/<name>: two connectors
            # never write the same landing files or tables
            home=path(home) if home else Path(env.get(ENV_HOME) or local_stack.DEFAULT_HOME).resolve() / (name or ""),
            granularity=Granularity.parse(slice_granularity or env.get(ENV_GRANULARITY, DEFAULT_GRANULARITY),
                                          "slice_granularity" if slice_granularity else ENV_GRANULARITY),
            config_path=config_path,
            properties={k: str(v) for k, v in connector_properties.items()} if connector_properties else None,
            start=parse_start(start_text, "slice_start" if slice_start is not None else ENV_START)
            if start_text else None,
            sensor_interval_seconds=interval,
            kafka_bootstrap=kafka_bootstrap or env.get(ENV_KAFKA) or None,
            tables=tables if tables is not None else tables_text in ("true", "1"),
            spark_master=spark_master or env.get(ENV_SPARK_MASTER) or DEFAULT_SPARK_MASTER,
            ranged=dict(ranged_snapshots or {}),
            name=name,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CdcSettings:
        """Everything from the environment (unset variables: the local stack `make dev` starts)."""
        return cls.resolve(environ=environ)
