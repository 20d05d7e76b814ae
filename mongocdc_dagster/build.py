"""All the Dagster definitions of one connector, from its settings and its discovered collections."""

from __future__ import annotations

import hashlib
import math
import os
import warnings
from collections.abc import Callable

from dagster import (
    AssetKey,
    AssetSelection,
    AutomationConditionSensorDefinition,
    BetaWarning,
    DagsterInstance,
    DefaultSensorStatus,
    Definitions,
    EnvVar,
    in_process_executor,
)

from mongocdc_dagster.assets.cdc import build_cdc_assets
from mongocdc_dagster.assets.tables import TableAssets, build_table_assets
from mongocdc_dagster.checks import build_gap_check, build_reconciliation_check
from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.jobs import build_maintenance, build_plan_job
from mongocdc_dagster.logs import LOGGERS, use_for_runs_without_loggers
from mongocdc_dagster.resources import MongoCdcKafkaResource, MongoCdcResource, build_pyspark_resource
from mongocdc_dagster.retries import table_run_tags
from mongocdc_dagster.schedules import build_continuity_schedule, build_latest_window_schedule
from mongocdc_dagster.sensors import build_sensors
from mongocdc_dagster.settings import ENV_PASSWORD, CdcSettings
from mongocdc_dagster.translator import MongoCdcTranslator

#: How many collections' tables one table automation sensor targets, on average: Dagster refuses a tick of an
#: automation sensor evaluated in the code location that targets more than 500 assets and checks having an
#: automation condition (``MAX_ENTITIES`` of its ``automation_condition_sensor_definition``), 2 per collection
#: today (changelog and current_state; ``matches_source`` has no condition of its own), 3 if its check got one.
TABLE_AUTOMATION_CHUNK = 120
#: The most collections one sensor may target: 3 entities each stays under Dagster's 500.
_MAX_CHUNK = 500 // 3


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
            sensors += build_table_automation(tables, settings.sensor_interval_seconds, translator)
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


def table_automation_chunks(namespaces: list[str]) -> list[list[str]]:
    """The collections each table automation sensor targets: one chunk per :data:`TABLE_AUTOMATION_CHUNK`
    collections, each collection in the chunk that ranks highest for it (rendezvous hashing of its namespace), so a
    collection added or dropped moves no other, and a further chunk takes a share of each but moves none between
    the others (a collection that moves starts with no condition state in its new sensor: it waits for its
    next landing). A chunk that draws more than :data:`_MAX_CHUNK` adds a chunk (never in practice)."""

    def rank(namespace: str, chunk: int) -> bytes:
        return hashlib.blake2b(f"{chunk}/{namespace}".encode(), digest_size=8).digest()

    count = max(1, math.ceil(len(namespaces) / TABLE_AUTOMATION_CHUNK))
    while True:
        chunks: list[list[str]] = [[] for _ in range(count)]
        for namespace in sorted(namespaces):
            chunks[max(range(count), key=lambda chunk: rank(namespace, chunk))].append(namespace)
        if max(len(chunk) for chunk in chunks) <= _MAX_CHUNK:
            return chunks
        count += 1


def build_table_automation(
    tables: TableAssets, interval_seconds: int, translator: MongoCdcTranslator
) -> list[AutomationConditionSensorDefinition]:
    """The sensors that evaluate the tables' automation conditions, one per chunk of collections
    (:func:`table_automation_chunks`), a collection's changelog and current_state (and their checks) in one.
    The first keeps the name one sensor always had (``<connector>_table_automation``), so a deployment of up to
    :data:`TABLE_AUTOMATION_CHUNK` collections keeps its single sensor and cursor; the others add ``_2``, ``_3``…
    Their runs carry the run-retry tags (``retries.table_run_tags``): a refresh whose worker was killed runs again
    at once, not at the failed-refresh back-off (which stays for a refresh whose step failed); and a maximum run
    time (``MongoCdcTranslator.table_run_max_runtime_seconds``), so one whose worker is gone without a trace ends."""
    names = tables.names
    keys_of: dict[str, list[AssetKey]] = {}
    for key, namespace in [*tables.changelog_keys.items(), *tables.current_state_keys.items()]:
        keys_of.setdefault(namespace, []).append(key)
    chunks = table_automation_chunks(list(keys_of))
    run_tags = table_run_tags(translator.table_run_max_runtime_seconds)
    sensors = []
    for index, chunk in enumerate(chunks):
        keys = [key for namespace in chunk for key in keys_of[namespace]]
        part = f" (part {index + 1} of {len(chunks)}: {len(chunk)} collections)" if len(chunks) > 1 else ""
        with warnings.catch_warnings():
            # `use_user_code_server` is beta in Dagster 1.13 and says so on every load: we need it (the tables'
            # condition is the translator's own, PoolInProgress, which only the code location can evaluate)
            warnings.filterwarnings("ignore", category=BetaWarning, message=".*`use_user_code_server`")
            sensors.append(AutomationConditionSensorDefinition(
                names.of("table_automation") + (f"_{index + 1}" if index else ""), target=AssetSelection.assets(*keys),
                default_status=DefaultSensorStatus.RUNNING, minimum_interval_seconds=interval_seconds,
                use_user_code_server=True, run_tags=run_tags,
                description=f"Refreshes changelog and current_state when slices or snapshots land{part}."))
    return sensors
