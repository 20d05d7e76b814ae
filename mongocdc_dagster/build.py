"""All the Dagster definitions of one connector, from its settings and its discovered collections."""

from __future__ import annotations

import os
from collections.abc import Callable

from dagster import (
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    EnvVar,
    in_process_executor,
)

from mongocdc_dagster.assets.cdc import build_cdc_assets
from mongocdc_dagster.assets.tables import build_table_assets
from mongocdc_dagster.checks import build_gap_check, build_reconciliation_check
from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.jobs import build_maintenance, build_plan_job
from mongocdc_dagster.logs import LOGGERS, use_for_runs_without_loggers
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource, build_pyspark_resource
from mongocdc_dagster.schedules import build_continuity_schedule, build_latest_window_schedule
from mongocdc_dagster.sensors import build_sensors
from mongocdc_dagster.settings import ENV_PASSWORD, CdcSettings
from mongocdc_dagster.translator import MongoCdcTranslator


def build_definitions(settings: CdcSettings, state: DiscoveryState, translator: MongoCdcTranslator | None = None,
                      store: Callable[[DagsterInstance], None] | None = None) -> Definitions:
    """One asset per collection and kind, their checks, sensors, schedules, jobs and resources, named after the
    connector (``settings.names``); ``store`` keeps what MongoDB captures now as the component's defs state."""
    translator = translator or MongoCdcTranslator()
    names = settings.names
    cfg = settings.load_config()
    cdc = build_cdc_assets(settings, cfg, state, translator)
    assets = list(cdc.definitions)
    checks = [c for c in (build_gap_check(cdc),) if c is not None]
    sensors = list(build_sensors(settings.sensor_interval_seconds, state, cdc, dict(settings.ranged), store))
    schedules = [build_latest_window_schedule(cdc), build_continuity_schedule(cdc)] if cdc.slices else []
    jobs = [build_plan_job(dict(settings.ranged), names)] if settings.ranged else []
    resources: dict[str, object] = {
        names.mongocdc: MongoCdcResource.from_settings(
            settings, EnvVar(ENV_PASSWORD) if os.environ.get(ENV_PASSWORD) else None),
        names.kafka: MongoCdcKafkaResource(bootstrap_servers=settings.kafka_bootstrap),
    }
    if settings.tables:
        tables = build_table_assets(settings, cfg, state, translator, cdc)
        assets += tables.definitions
        checks += [c for c in (build_reconciliation_check(tables),) if c is not None]
        resources[names.pyspark] = build_pyspark_resource(settings)
        if tables.tables:
            maintenance_job, maintenance_schedule = build_maintenance(tables.tables, names)
            jobs.append(maintenance_job)
            schedules.append(maintenance_schedule)
            sensors.append(AutomationConditionSensorDefinition(
                names.of("table_automation"), target=AssetSelection.assets(*tables.changelog_keys, *tables.current_state_keys),
                default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=settings.sensor_interval_seconds,
                # the tables' condition is the translator's own (PoolInProgress): the code location evaluates it
                use_user_code_server=True,
                description="Refreshes changelog and current_state when slices or snapshots land."))
    use_for_runs_without_loggers()  # the UI's and the automation's runs name no logger
    return Definitions(
        assets=assets,
        asset_checks=checks,
        sensors=sensors,
        schedules=schedules,
        jobs=jobs,
        resources=resources,
        loggers=LOGGERS,  # a run's console lines in mongocdc's format (logs.RUN_CONFIG names them)
        # a run's steps share one process: a step subprocess would only add start-up time (and a JVM per step)
        executor=in_process_executor,
    )
