"""The code location: `defs`, loaded by workspace.yaml (`python_module: mongocdc_dagster.definitions`).

Everything is configured by the environment (see settings.py): MONGOCDC_CONFIG names the connector config
`mongocdc run` takes, MONGOCDC_HOME holds the landing zone, tables and state; with neither set it points at
the local stack `make dev` starts.
"""

from __future__ import annotations

import os

from dagster import Definitions, EnvVar, in_process_executor

from mongocdc_core.config import ConnectorConfig
from mongocdc_dagster.assets.cdc import build_cdc_assets
from mongocdc_dagster.assets.tables import table_assets, table_checks
from mongocdc_dagster.checks import build_checks
from mongocdc_dagster.partitions import CdcPartitions
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource, build_pyspark_resource
from mongocdc_dagster.schedules import build_latest_window_schedule
from mongocdc_dagster.sensors import build_sensors
from mongocdc_dagster.settings import ENV_PASSWORD, ENV_SPARK_MASTER, CdcSettings
from mongocdc_dagster.translator import MongoCdcTranslator


def build_definitions(settings: CdcSettings, translator: MongoCdcTranslator | None = None) -> Definitions:
    """All CDC definitions for one connector, configured by `settings`."""
    cfg = ConnectorConfig.load(settings.config_path)
    partitions = CdcPartitions.from_settings(settings)
    cdc = build_cdc_assets(cfg, settings.landing_dir, partitions, translator)
    password = EnvVar(ENV_PASSWORD) if os.environ.get(ENV_PASSWORD) else None
    return Definitions(
        assets=[*cdc.assets, *table_assets],
        asset_checks=[*build_checks(cdc, partitions), *table_checks],
        sensors=build_sensors(settings.sensor_interval_seconds, cdc, partitions),
        schedules=[build_latest_window_schedule(cdc, partitions, settings.granularity.cron)],
        resources={
            "mongocdc": MongoCdcResource(
                config_path=str(settings.config_path), home=str(settings.home), mongodb_password=password
            ),
            "kafka": MongoCdcKafkaResource(bootstrap_servers=settings.kafka_bootstrap),
            "pyspark": build_pyspark_resource(settings, os.environ.get(ENV_SPARK_MASTER, "local[2]")),
        },
        # One asset per run: a step subprocess would only add start-up time.
        executor=in_process_executor,
    )


defs = build_definitions(CdcSettings.from_env())
