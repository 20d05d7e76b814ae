"""The code location loads as Dagster's own tools see it: workspace.yaml, `dg check defs`, and a project that
scaffolds MongoCdcComponent with `dg scaffold defs` and lists one asset per discovered collection."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetSelection,
    AutomationConditionSensorDefinition,
    DagsterInstance,
    DagsterRunStatus,
    Definitions,
    build_sensor_context,
    define_asset_job,
)
from pymongo.database import Database

from mongocdc_dagster import local_stack
from mongocdc_dagster.build import TABLE_AUTOMATION_CHUNK, build_definitions
from mongocdc_dagster.discovery import CollectionInfo, DiscoveryState, discover
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.settings import CdcSettings, SettingsError
from tests.dagster.cdc_helpers import write_config

BIN = Path(sys.executable).parent


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MONGOCDC_", "DAGSTER_"))}
    return {**env, "DAGSTER_HOME": str(tmp_path), "VIRTUAL_ENV": str(BIN.parent),
            "PATH": f"{BIN}:{env.get('PATH', '')}", **extra}


def test_workspace_yaml_validates(tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    db.orders.insert_one({"_id": 1})
    config = write_config(tmp_path / "connector.json", mongo_uri, db.name)
    result = subprocess.run(
        [str(BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=local_stack.REPO_ROOT, env=_env(tmp_path, MONGOCDC_CONFIG=str(config)), capture_output=True, text=True,
        timeout=180, check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All code locations passed validation" in result.stdout + result.stderr


def test_dg_check_defs_passes_on_the_project(tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    db.orders.insert_one({"_id": 1})
    config = write_config(tmp_path / "connector.json", mongo_uri, db.name)
    result = subprocess.run([str(BIN / "dg"), "check", "defs"], cwd=local_stack.REPO_ROOT,
                            env=_env(tmp_path, MONGOCDC_CONFIG=str(config)), capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "All definitions loaded successfully" in result.stdout + result.stderr


def test_definitions_load_when_mongodb_is_down_and_say_why(tmp_path: Path) -> None:
    config = tmp_path / "c.properties"
    config.write_text("mongodb.connection.string=mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=500\n"
                      "topic.prefix=p\n")
    state = discover(MongoCdcResource.for_load(CdcSettings.resolve(connector_config=str(config), environ={})))
    assert state.namespaces == () and state.error is not None and "127.0.0.1:9" in state.error
    assert DiscoveryState.from_json(state.to_json()) == state


def test_the_stored_state_with_dropped_collections_is_a_version_older_readers_reject() -> None:
    """``dropped_at`` came with version 2: a version-1 reader (after a rollback) would read the dropped
    collections as captured, so it must reject the state; version-1 states still load."""
    when = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    state = DiscoveryState((CollectionInfo("db.a", 1), CollectionInfo("db.gone", 2, dropped_at=when)), when)
    stored = orjson.loads(state.to_json())
    assert stored["version"] == 2 and DiscoveryState.from_json(state.to_json()) == state
    old = {**stored, "version": 1, "collections": [{"namespace": "db.a", "estimated_documents": 1}]}
    assert DiscoveryState.from_json(orjson.dumps(old).decode()).namespaces == ("db.a",)


def test_dg_scaffolds_the_component_and_lists_one_asset_per_collection(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    db.orders.insert_one({"_id": 1})
    db.customers.insert_one({"_id": 1})
    project = tmp_path / "proj"
    (project / "myproj" / "defs").mkdir(parents=True)
    (project / "myproj" / "__init__.py").write_text("")
    (project / "myproj" / "defs" / "__init__.py").write_text("")
    (project / "myproj" / "definitions.py").write_text(
        "from pathlib import Path\nimport dagster as dg\n\n\n@dg.definitions\ndef defs():\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n")
    (project / "pyproject.toml").write_text(
        '[project]\nname = "myproj"\nversion = "0.1"\n[tool.dg]\ndirectory_type = "project"\n'
        '[tool.dg.project]\nroot_module = "myproj"\n')
    env = _env(tmp_path, PYTHONPATH=str(project))
    scaffold = subprocess.run([str(BIN / "dg"), "scaffold", "defs", "mongocdc_dagster.MongoCdcComponent", "cdc"],
                              cwd=project, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert scaffold.returncode == 0, scaffold.stdout + scaffold.stderr
    folder = project / "myproj" / "defs" / "cdc"
    defs_yaml = (folder / "defs.yaml").read_text()
    assert "type: mongocdc_dagster.MongoCdcComponent" in defs_yaml and "connector_config: connector.json" in defs_yaml
    scaffolded = orjson.loads((folder / "connector.json").read_bytes())
    assert "mongodb.connection.string" in scaffolded["config"]
    write_config(folder / "connector.json", mongo_uri, db.name)
    (folder / "defs.yaml").write_text(defs_yaml + "  translation:\n    group_name: \"cdc_{{ collection }}\"\n")
    listed = subprocess.run([str(BIN / "dg"), "list", "defs", "--json"], cwd=project, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assets = {a["asset_key"]: a for a in json.loads(listed.stdout)["assets"]}
    for coll in ("orders", "customers"):
        for kind in ("snapshot", "incremental_snapshot", "slices", "changelog", "current_state"):
            assert f"{db.name}/{coll}/{kind}" in assets
        assert assets[f"{db.name}/{coll}/current_state"]["group_name"] == f"cdc_{coll}"
    assert sorted(assets[f"{db.name}/orders/current_state"]["dependency_keys"]) == [f"{db.name}/orders/changelog"]
    assert f"{db.name}/signals/snapshot" not in assets  # the signaling collection is not data


def test_settings_name_what_is_wrong() -> None:
    with pytest.raises(SettingsError, match="slice_granularity='7min'"):
        CdcSettings.resolve(slice_granularity="7min", environ={})
    with pytest.raises(SettingsError, match="MONGOCDC_SLICE_START='yesterday'"):
        CdcSettings.from_env({"MONGOCDC_SLICE_START": "yesterday"})
    with pytest.raises(SettingsError, match="not both"):
        CdcSettings.resolve(connector_config="a.json", connector_properties={"topic.prefix": "p"}, environ={})
    defaults = CdcSettings.from_env({})
    assert defaults.config_path == local_stack.DEFAULT_CONFIG and defaults.home == local_stack.DEFAULT_HOME
    assert defaults.start is None  # windows start where the oplog starts, not at a fixed date


def test_inline_properties_and_the_password_secret(tmp_path: Path) -> None:
    resource = MongoCdcResource(connector_properties={"mongodb.connection.string": "mongodb://127.0.0.1:1/",
                                                      "topic.prefix": "p", "mongodb.user": "cdc"},
                                home=str(tmp_path), mongodb_password="s3cret")
    assert resource.load_config().mongodb_password == "s3cret" and resource.load_config().topic_prefix == "p"


def test_make_dev_adds_to_an_instances_python_logs_what_it_lacks_and_keeps_the_rest(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "dagster.yaml"
    path.write_text("python_logs:\n  managed_python_loggers: [myproject]\n  python_log_level: WARNING\n"
                    "run_monitoring:\n  enabled: true\n")
    with caplog.at_level(logging.INFO, "mongocdc.dev"):
        local_stack.add_python_logs(path)
    assert yaml.safe_load(path.read_text()) == {
        "python_logs": {"managed_python_loggers": ["myproject", "mongocdc", "mongocdc_core"],
                        "python_log_level": "WARNING"},  # the operator's level stays
        "run_monitoring": {"enabled": True}}
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: added python_logs managed_python_loggers mongocdc, mongocdc_core "
        "(mongocdc's log records in each run's event log)"]
    path.write_text("- not\n- a mapping\n")
    with pytest.raises(SystemExit, match="dagster.yaml: expected a mapping"):
        local_stack.add_python_logs(path)


def test_make_dev_keeps_an_existing_dagster_home_and_points_the_connector_at_its_emulator(tmp_path: Path) -> None:
    home = tmp_path / "dagster"
    home.mkdir()
    own = "# the operator's own instance config\ntelemetry:\n  enabled: false\n"
    (home / "dagster.yaml").write_text(own)
    local_stack.prepare_dagster_home(home)
    kept = (home / "dagster.yaml").read_text()
    # kept as written, with the project's python_logs block added; again, nothing changes
    assert kept.startswith(own) and yaml.safe_load(kept) == {
        "telemetry": {"enabled": False},
        "python_logs": {"managed_python_loggers": ["mongocdc", "mongocdc_core"], "python_log_level": "INFO"}}
    local_stack.prepare_dagster_home(home)
    assert (home / "dagster.yaml").read_text() == kept
    fresh = local_stack.prepare_dagster_home(tmp_path / "fresh")
    assert (fresh / "dagster.yaml").read_text() == local_stack.DAGSTER_YAML.read_text()
    from dagster import DagsterInstance
    from dagster._core.instance.config import PoolGranularity

    with DagsterInstance.from_config(str(fresh)) as instance:
        limits = {p: instance.event_log_storage.get_concurrency_info(p).slot_count
                  for p in ("mongocdc_snapshots", "mongocdc_snapshot_ranges", "mongocdc_slices")}
        assert limits == {"mongocdc_snapshots": 2, "mongocdc_snapshot_ranges": 4, "mongocdc_slices": 1}
        # a run holds its pools from launch to end, and one whose pool is full stays queued: no run worker (and
        # no Spark JVM) idle beside the run that has the slot, no refresh taking the slot between another's steps
        pools = instance.get_concurrency_config().pool_config  # what the run queue daemon goes by
        assert pools.pool_granularity == PoolGranularity.RUN and pools.default_pool_limit == 1
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 0  # only runs that ask
        instance.event_log_storage.set_concurrency_slots("mongocdc_snapshots", 5)
    local_stack.prepare_dagster_home(fresh)  # a limit the operator set is kept
    with DagsterInstance.from_config(str(fresh)) as instance:
        assert instance.event_log_storage.get_concurrency_info("mongocdc_snapshots").slot_count == 5
    config = CdcSettings.resolve(connector_config=str(local_stack.write_local_config(tmp_path / "c.json", 27555)),
                                 environ={}).load_config()
    assert config.mongodb_connection_string == local_stack.emulator_uri(27555)


def test_the_instance_gives_back_the_pool_slot_of_a_run_whose_worker_was_killed(tmp_path: Path) -> None:
    """With pools by op (an instance switched from the project's pools by run), a run worker killed mid-step
    keeps its op's pool slot claimed; with the project's run monitoring the daemon gives it back a minute
    after the run was marked failed, so the pool (slices: one slot) does not stay full with every later
    slice run queued behind a run that no longer exists."""
    import logging
    from datetime import timedelta
    from types import SimpleNamespace

    from dagster import DagsterInstance, DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test, freeze_time
    from dagster._daemon.monitoring import execute_concurrency_slots_iteration
    from dagster._time import get_current_datetime

    home = local_stack.prepare_dagster_home(tmp_path / "dagster")
    with DagsterInstance.from_config(str(home)) as instance:
        storage = instance.event_log_storage
        storage.set_concurrency_slots("mongocdc_slices", 1)
        run = create_run_for_test(instance, status=DagsterRunStatus.STARTED)
        assert storage.claim_concurrency_slot("mongocdc_slices", run.run_id, "mongocdc_slices").is_claimed
        instance.report_run_failed(run, "the run worker was killed")  # marked failed from outside, as Dagster does
        context = SimpleNamespace(instance=instance)
        with freeze_time(get_current_datetime() + timedelta(seconds=61)):
            list(execute_concurrency_slots_iteration(context, logging.getLogger("test")))  # type: ignore[arg-type]
        assert storage.get_concurrency_info("mongocdc_slices").claimed_slots == []


def test_a_named_connector_without_a_home_of_its_own_writes_under_its_name(tmp_path: Path) -> None:
    """Two connectors of one project never share landing files or tables; ``mongocdc`` is the default's."""
    env = {"MONGOCDC_HOME": str(tmp_path / "home")}
    props = {"mongodb.connection.string": "mongodb://h:1/?replicaSet=rs0", "topic.prefix": "p"}
    default = CdcSettings.resolve(connector_properties=props, environ=env)
    named = CdcSettings.resolve(connector_properties=props, environ=env, name="cdc2")
    assert default.home == (tmp_path / "home").resolve() and named.home == (tmp_path / "home" / "cdc2").resolve()
    assert named.landing_dir != default.landing_dir and named.tables_root != default.tables_root
    explicit = CdcSettings.resolve(connector_properties=props, environ=env, name="cdc2", home=str(tmp_path / "own"))
    assert explicit.home == (tmp_path / "own").resolve()
    with pytest.raises(SettingsError, match="name='mongocdc' is what the project's default connector"):
        CdcSettings.resolve(connector_properties=props, environ=env, name="mongocdc")



def test_the_table_automation_of_hundreds_of_collections_stays_under_dagsters_limit_per_sensor(tmp_path: Path) -> None:
    """Dagster refuses, on every tick, an automation sensor evaluated in the code location that targets more than
    500 assets and checks with a condition: one sensor over every collection's tables never refreshed a deployment
    of more than 250 collections. The tables are split over several sensors, each collection in exactly one, and a
    refresh started by one sensor holds the others' back as it held the one sensor's (the tables' pool)."""
    config = write_config(tmp_path / "connector.json", "mongodb://127.0.0.1:9/", "big")
    settings = CdcSettings.resolve(connector_config=str(config), home=str(tmp_path / "home"), slice_granularity="1min",
                                   slice_start="2026-01-01T00:00:00+00:00", tables=True, environ={})
    defs = build_definitions(settings, DiscoveryState.of([f"big.c{i:03d}" for i in range(300)]))
    repository = defs.get_repository_def()
    graph = repository.asset_graph
    tables = {spec.key for spec in defs.resolve_all_asset_specs()
              if spec.tags.get("mongocdc/kind") in ("changelog", "current_state")}
    assert len(tables) == 600
    sensors = [s for s in repository.sensor_defs if isinstance(s, AutomationConditionSensorDefinition)]
    assert len(sensors) > 1 and sensors[0].name == "mongocdc_table_automation"
    targeted = Counter(key for sensor in sensors for key in sensor.asset_selection.resolve(graph))
    assert set(targeted) == tables and set(targeted.values()) == {1}  # each table in exactly one sensor
    for sensor in sensors:  # a collection's changelog and current_state together
        keys = sensor.asset_selection.resolve(graph)
        assert {AssetKey([*key.path[:-1], kind]) for key in keys for kind in ("changelog", "current_state")} == keys
    with DagsterInstance.ephemeral() as instance:

        def tick(sensor: AutomationConditionSensorDefinition, cursor: str | None) -> tuple[set[AssetKey], str]:
            result = sensor.evaluate_tick(build_sensor_context(instance=instance, repository_def=repository,
                                                               cursor=cursor))
            assert result.cursor is not None, sensor.name
            return {key for request in result.run_requests or [] for key in request.asset_selection or ()}, result.cursor

        cursors = []
        for sensor in sensors:  # one tick each: Dagster's limit is checked when a tick evaluates
            requested, cursor = tick(sensor, None)
            assert requested == set(), sensor.name
            cursors.append(cursor)
        first, second = (sorted(sensor.asset_selection.resolve(graph))[0] for sensor in sensors[:2])
        for table in (first, second):  # a snapshot of a collection of each of the first two sensors lands
            instance.report_runless_asset_event(AssetMaterialization(AssetKey([*table.path[:-1], "snapshot"])))
        requested, cursors[0] = tick(sensors[0], cursors[0])
        refresh = {AssetKey([*first.path[:-1], kind]) for kind in ("changelog", "current_state")}
        assert requested == refresh
        job = Definitions.merge(defs, Definitions(jobs=[define_asset_job("refresh", AssetSelection.assets(*refresh))]))
        running = instance.create_run_for_job(job.resolve_job_def("refresh"), status=DagsterRunStatus.STARTED,
                                              asset_selection=frozenset(refresh))
        requested, cursors[1] = tick(sensors[1], cursors[1])
        assert requested == set(), "the second sensor queued a refresh behind the first one's"
        instance.report_run_canceled(running)
        requested, cursors[1] = tick(sensors[1], cursors[1])
        assert requested == {AssetKey([*second.path[:-1], kind]) for kind in ("changelog", "current_state")}


def test_a_few_collections_keep_the_one_table_automation_sensor(tmp_path: Path) -> None:
    """A deployment under the split size keeps its single sensor (and its cursor) under the name it always had;
    adding collections moves none from the sensor it is in unless the number of sensors grows."""
    config = write_config(tmp_path / "connector.json", "mongodb://127.0.0.1:9/", "big")
    settings = CdcSettings.resolve(connector_config=str(config), home=str(tmp_path / "home"), slice_granularity="1min",
                                   slice_start="2026-01-01T00:00:00+00:00", tables=True, environ={})

    def sensors(count: int) -> dict[str, set[AssetKey]]:
        defs = build_definitions(settings, DiscoveryState.of([f"big.c{i:03d}" for i in range(count)]))
        repository = defs.get_repository_def()
        return {s.name: set(s.asset_selection.resolve(repository.asset_graph)) for s in repository.sensor_defs
                if isinstance(s, AutomationConditionSensorDefinition)}

    few = sensors(20)
    assert list(few) == ["mongocdc_table_automation"] and len(few["mongocdc_table_automation"]) == 40
    size = TABLE_AUTOMATION_CHUNK
    full, more, many = sensors(size), sensors(size + 1), sensors(size * 9 // 5)
    assert list(full) == ["mongocdc_table_automation"]
    assert list(more) == list(many) == ["mongocdc_table_automation", "mongocdc_table_automation_2"]
    # the second sensor takes a share of the first; collections added later join one and move none
    added = {AssetKey(["big", f"c{size:03d}", kind]) for kind in ("changelog", "current_state")}
    assert more["mongocdc_table_automation"] - added < full["mongocdc_table_automation"]
    assert 2 * (size + 1) // 5 < len(more["mongocdc_table_automation_2"]) < 8 * (size + 1) // 5
    assert all(more[name] <= many[name] for name in more)
