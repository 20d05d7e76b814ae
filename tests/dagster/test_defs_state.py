"""The component's defs state and names, as Dagster's own tools meet them: command-line launches rebuild the
definitions from the stored state, a load while MongoDB is unreachable builds the last stored collections (and
says so), and several connectors load side by side in one project."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AssetCheckKey,
    AssetKey,
    AssetSelection,
    DagsterInstance,
    Definitions,
    build_schedule_context,
    define_asset_job,
    instance_for_test,
    load_from_defs_folder,
)
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
from dagster._core.definitions.repository_definition.repository_definition import RepositoryLoadData
from dagster._core.storage.defs_state.blob_storage_state_storage import UPathDefsStateStorage
from pymongo.database import Database

from mongocdc_dagster import local_stack
from mongocdc_dagster.build import build_definitions
from mongocdc_dagster.component import MongoCdcComponent, PrunedDefsStateWarning, prune_stored_versions
from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.sensors import build_discovery_sensor
from tests.dagster.cdc_helpers import make_env, write_config

BIN = Path(sys.executable).parent
UNREACHABLE = "mongodb://127.0.0.1:9/?serverSelectionTimeoutMS=500"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A subprocess environment with a Dagster instance set up as ``make dev`` sets one up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MONGOCDC_", "DAGSTER_"))}
    home = local_stack.prepare_dagster_home(tmp_path / "dagster_home")
    return {**env, "DAGSTER_HOME": str(home), "VIRTUAL_ENV": str(BIN.parent),
            "PATH": f"{BIN}:{env.get('PATH', '')}", **extra}


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _project(root: Path, components: dict[str, str]) -> Path:
    """A dg project ``proj`` whose defs folder holds one ``defs.yaml`` per entry (folder -> attributes YAML)."""
    package = root / "proj"
    (package / "defs").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(
        "from pathlib import Path\nimport dagster as dg\n\n\n@dg.definitions\ndef defs():\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n")
    (root / "pyproject.toml").write_text(
        '[project]\nname = "proj"\nversion = "0.1"\n[tool.dg]\ndirectory_type = "project"\n'
        '[tool.dg.project]\nroot_module = "proj"\n')
    for folder, attributes in components.items():
        (package / "defs" / folder).mkdir()
        (package / "defs" / folder / "defs.yaml").write_text(
            f"type: mongocdc_dagster.MongoCdcComponent\nattributes:\n{attributes}")
    return root


def _entries(listed: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(entry, sort_keys=True) for entry in listed)


def test_command_line_launches_build_the_definitions_from_the_stored_state(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    db.orders.insert_many([{"_id": i} for i in range(3)])
    config = write_config(tmp_path / "connector.json", mongo_uri, db.name)
    env = _env(tmp_path, MONGOCDC_CONFIG=str(config), MONGOCDC_HOME=str(tmp_path / "home"))
    key = f"{db.name}/orders/snapshot"
    _run([str(BIN / "dagster"), "asset", "materialize", "-m", "mongocdc_dagster.definitions", "--select", key],
         local_stack.REPO_ROOT, env)
    _run([str(BIN / "dg"), "launch", "--assets", key], local_stack.REPO_ROOT, env)
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        runs = instance.get_runs()
        assert [r.status.value for r in runs] == ["SUCCESS", "SUCCESS"]
        materialized = instance.fetch_materializations(AssetKey.from_user_string(key), limit=10).records
        assert [r.asset_materialization.metadata["dagster/row_count"].value for r in materialized
                if r.asset_materialization is not None] == [3, 3]


def test_a_load_while_mongodb_is_unreachable_builds_the_stored_collections_and_says_so(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    db.orders.insert_one({"_id": 1})
    db.customers.insert_one({"_id": 1})
    project = _project(tmp_path / "p", {"cdc": "  connector_config: connector.json\n  home: home\n"})
    config = project / "proj" / "defs" / "cdc" / "connector.json"
    write_config(config, UNREACHABLE, db.name)
    env = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")]))
    first = _run([str(BIN / "dg"), "list", "defs", "--json"], project, env)  # MongoDB down, nothing stored yet
    assert json.loads(first.stdout)["assets"] == []
    assert "no collections are stored as defs state yet, so the definitions have none" in first.stderr
    write_config(config, mongo_uri, db.name)
    listed = _run([str(BIN / "dg"), "list", "defs", "--json"], project, env)
    up = json.loads(listed.stdout)
    assert "MongoDB could not be listed" not in listed.stderr
    assert {a["asset_key"] for a in up["assets"]} >= {f"{db.name}/orders/slices", f"{db.name}/customers/current_state"}
    config.write_text(config.read_text().replace(mongo_uri, UNREACHABLE))  # the same connector, MongoDB down
    down_listed = _run([str(BIN / "dg"), "list", "defs", "--json"], project, env)
    down = json.loads(down_listed.stdout)
    for kind in ("assets", "asset_checks", "sensors", "schedules", "jobs", "resources"):
        assert _entries(down[kind]) == _entries(up[kind]) and up[kind], kind
    assert "StoredDefsStateWarning: MongoDB could not be listed when the code location loaded" in down_listed.stderr
    assert "127.0.0.1:9" in down_listed.stderr and "built from the 2 collection(s) stored as defs state" in (
        down_listed.stderr)


def test_the_discovery_sensor_says_the_definitions_came_from_the_stored_state_and_refreshes_it(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    db.create_collection("alpha")
    env = make_env(tmp_path, mongo_uri, db, ["alpha"])
    component = MongoCdcComponent(connector_config=str(tmp_path / "connector.json"), home=str(tmp_path / "home"))
    with instance_for_test() as instance:
        stored = DiscoveryState(env.state.collections, env.state.discovered_at, None, "ConnectError: down", True)
        sensor = build_discovery_sensor(30, stored, env.cdc, {}, component.store_state)
        down = MongoCdcResource(connector_properties={"mongodb.connection.string": UNREACHABLE, "topic.prefix": "p",
                                                      "connect.max.attempts": "1"}, home=str(tmp_path / "home"))
        unanswered = sensor(_context(instance, down, None))
        assert "MongoDB did not answer" in unanswered.skip_message
        assert "built from the 1 collection(s) stored as defs state" in unanswered.skip_message
        back = sensor(_context(instance, env.mongocdc, None))
        assert "built from the 1 collection(s) stored as defs state" in back.skip_reason.skip_message
        assert "stored the" not in back.skip_reason.skip_message  # MongoDB captures what is stored: nothing to store
        assert instance.defs_state_storage is not None
        assert instance.defs_state_storage.get_latest_version(component.defs_state_config.key) is None
        db.create_collection("beta")  # captured now, not yet in the stored state
        changed = sensor(_context(instance, env.mongocdc, back.cursor))
        assert "stored the 2 captured collection(s) as the defs state" in changed.skip_reason.skip_message
        version = instance.defs_state_storage.get_latest_version(component.defs_state_config.key)
        assert version is not None
        state_file = tmp_path / "state"
        instance.defs_state_storage.download_state_to_path(component.defs_state_config.key, version, state_file)
        assert DiscoveryState.from_json(state_file.read_text()).namespaces == (env.ns("alpha"), env.ns("beta"))
        again = sensor(_context(instance, env.mongocdc, changed.cursor))
        assert "stored the" not in again.skip_reason.skip_message  # stored once
        assert instance.defs_state_storage.get_latest_version(component.defs_state_config.key) == version


def _context(instance: DagsterInstance, resource: MongoCdcResource, cursor: str | None) -> Any:
    from dagster import build_sensor_context

    return build_sensor_context(instance=instance, cursor=cursor, resources={"mongocdc": resource})


def test_two_connectors_load_in_one_project_each_with_its_own_names(
        tmp_path: Path, mongo_uri: str, db: Database[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    db.orders.insert_one({"_id": 1})
    project = _project(tmp_path / "p", {
        "cdc": "  connector_config: connector.json\n  home: home\n",
        "cdc2": "  name: cdc2\n  connector_config: connector.json\n  home: home\n  translation:\n    key_prefix: cdc2\n",
    })
    for folder in ("cdc", "cdc2"):
        write_config(project / "proj" / "defs" / folder / "connector.json", mongo_uri, db.name)
    env = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")]))
    checked = _run([str(BIN / "dg"), "check", "defs"], project, env)
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    monkeypatch.syspath_prepend(str(project))
    with instance_for_test():
        defs = load_from_defs_folder(path_within_project=project / "proj")
    assert set(defs.resources or {}) == {"mongocdc", "kafka", "pyspark",
                                         "mongocdc_cdc2", "mongocdc_cdc2_kafka", "mongocdc_cdc2_pyspark"}
    sensors = {s.name for s in defs.sensors or []}
    assert {"mongocdc_signals", "mongocdc_cdc2_signals", "mongocdc_collection_discovery",
            "mongocdc_cdc2_collection_discovery", "mongocdc_oplog_window", "mongocdc_cdc2_oplog_window",
            "mongocdc_table_automation", "mongocdc_cdc2_table_automation"} <= sensors
    schedules = {s.name for s in defs.schedules or []}
    assert {"mongocdc_latest_window", "mongocdc_cdc2_latest_window", "mongocdc_continuity",
            "mongocdc_cdc2_continuity"} <= schedules
    repository = defs.get_repository_def()
    assert {"mongocdc_table_maintenance", "mongocdc_cdc2_table_maintenance"} <= set(repository.job_names)
    pools = {a.node_def.name: a.node_def.pool for a in repository.assets_defs_by_key.values()}
    assert pools["mongocdc_slices"] == "mongocdc_slices" and pools["mongocdc_cdc2_slices"] == "mongocdc_cdc2_slices"
    assert pools["mongocdc_cdc2_snapshot"] == "mongocdc_cdc2_snapshots"
    assert pools["mongocdc_tables"] == "mongocdc_tables" and pools["mongocdc_cdc2_tables"] == "mongocdc_cdc2_tables"
    for kind in ("snapshot", "slices", "current_state"):
        assert {f"{db.name}/orders/{kind}", f"cdc2/{db.name}/orders/{kind}"} <= {
            k.to_user_string() for k in repository.assets_defs_by_key}


def test_two_connectors_with_the_same_name_are_refused_with_what_to_do(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    project = _project(tmp_path / "p", {folder: "  connector_config: connector.json\n  home: home\n"
                                        for folder in ("cdc", "other")})
    for folder in ("cdc", "other"):
        write_config(project / "proj" / "defs" / folder / "connector.json", mongo_uri, db.name)
    env = _env(tmp_path, PYTHONPATH=os.pathsep.join([str(project), os.environ.get("PYTHONPATH", "")]))
    checked = subprocess.run([str(BIN / "dg"), "check", "defs"], cwd=project, env=env, capture_output=True, text=True,
                             timeout=300, check=False)
    assert checked.returncode != 0
    assert "2 MongoCdcComponents are unnamed: give each connector of the project its own `name`" in (
        checked.stdout + checked.stderr)


def test_old_stored_versions_of_the_defs_state_are_pruned(tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    """Every load and every change the discovery sensor stores writes a version of the defs state: the newest
    10 and every one younger than a day are kept, older ones beyond those deleted, the latest never."""
    db.create_collection("alpha")
    write_config(tmp_path / "connector.json", mongo_uri, db.name)
    component = MongoCdcComponent(connector_config=str(tmp_path / "connector.json"), home=str(tmp_path / "home"))
    key = component.defs_state_config.key
    with instance_for_test() as instance:
        storage = instance.defs_state_storage
        assert isinstance(storage, UPathDefsStateStorage)
        folder = Path(str(storage.base_path)) / storage._sanitize_key(key)
        for _ in range(12):
            component.store_state(instance)
        versions = sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime)
        assert len(versions) == 12  # all younger than a day: none pruned
        two_days_ago = time.time() - 2 * 86400
        for i, path in enumerate(versions):  # as if stored two days ago, one second apart, in the same order
            os.utime(path, (two_days_ago + i, two_days_ago + i))
        component.store_state(instance)
        latest = storage.get_latest_version(key)
        left = {p.name for p in folder.iterdir()}
        assert left == {latest} | {p.name for p in versions[-9:]}, (len(left), latest)
        state_file = tmp_path / "state"
        storage.download_state_to_path(key, latest, state_file)  # type: ignore[arg-type]
        assert DiscoveryState.from_json(state_file.read_text()).namespaces == (f"{db.name}.alpha",)


def test_a_run_worker_whose_pinned_version_was_pruned_builds_from_the_latest_and_says_so(
        tmp_path: Path, mongo_uri: str, db: Database[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A code server up for days launches its runs at the version it pinned at load; once 10 newer versions are
    stored and it is older than a day, pruning deletes it, and the run worker builds from the latest instead."""
    db.create_collection("alpha")
    project = _project(tmp_path / "p", {"cdc": "  connector_config: connector.json\n  home: home\n"})
    config = project / "proj" / "defs" / "cdc" / "connector.json"
    write_config(config, mongo_uri, db.name)
    monkeypatch.syspath_prepend(str(project))
    for module in [name for name in sys.modules if name == "proj" or name.startswith("proj.")]:
        monkeypatch.delitem(sys.modules, module)  # another test's project of the same name
    component = MongoCdcComponent(connector_config=str(config), home=str(project / "proj" / "defs" / "cdc" / "home"))
    key = component.defs_state_config.key
    with instance_for_test() as instance:
        storage = instance.defs_state_storage
        assert isinstance(storage, UPathDefsStateStorage)
        with DefinitionsLoadContext.scoped(DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)) as loaded:
            initial = load_from_defs_folder(path_within_project=project / "proj")
        pinned = loaded.accessed_defs_state_info
        assert pinned is not None
        version = pinned.get_version(key)
        assert version is not None
        for _ in range(11):  # dg commands, checks, replicas, discovery sensor changes
            component.store_state(instance)
        folder = Path(str(storage.base_path)) / storage._sanitize_key(key)
        two_days_ago = time.time() - 2 * 86400
        os.utime(folder / version, (two_days_ago, two_days_ago))
        assert prune_stored_versions(storage, key) == [version]
        latest = storage.get_latest_version(key)
        assert latest is not None and latest != version
        reconstruction = DefinitionsLoadContext(DefinitionsLoadType.RECONSTRUCTION,
                                                RepositoryLoadData(defs_state_info=pinned))
        with DefinitionsLoadContext.scoped(reconstruction), pytest.warns(PrunedDefsStateWarning) as said:
            rebuilt = load_from_defs_folder(path_within_project=project / "proj")
    message = str(said[0].message)
    assert f"version {version} (pinned when the code location loaded) is no longer stored" in message
    assert f"built from the latest stored version, {latest}" in message
    keys = set(rebuilt.resolve_all_asset_keys())
    assert keys == set(initial.resolve_all_asset_keys())
    assert AssetKey([db.name, "alpha", "snapshot"]) in keys


def test_a_dropped_collection_keeps_its_assets_so_a_run_naming_it_can_be_retried(
        tmp_path: Path, mongo_uri: str, db: Database[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The schedule's slice run named every collection; one is dropped and the code location reloads before
    Dagster retries the run. The retry resolves the run's asset selection against the reloaded definitions
    (a ``DagsterInvalidSubsetError`` when a key left them, and the windows stay a gap): the dropped
    collection's assets stay, marked dropped, and no slices of windows after the drop are requested for it."""
    db.create_collection("alpha")
    db.create_collection("beta")
    start = (datetime.now(UTC) - timedelta(hours=1)).replace(second=0, microsecond=0).isoformat()
    project = _project(tmp_path / "p", {"cdc": "  connector_config: connector.json\n  home: home\n"
                                               f"  slice_granularity: 1min\n  slice_start: '{start}'\n"})
    write_config(project / "proj" / "defs" / "cdc" / "connector.json", mongo_uri, db.name)
    monkeypatch.syspath_prepend(str(project))
    for module in [name for name in sys.modules if name == "proj" or name.startswith("proj.")]:
        monkeypatch.delitem(sys.modules, module)  # another test's project of the same name
    alpha, beta = AssetKey([db.name, "alpha", "slices"]), AssetKey([db.name, "beta", "slices"])
    with instance_for_test() as instance:
        def load() -> Any:
            with DefinitionsLoadContext.scoped(DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)):
                return load_from_defs_folder(path_within_project=project / "proj")

        assert {alpha, beta} <= set(load().resolve_all_asset_keys())
        db.drop_collection("beta")
        dropped_at = datetime.now(UTC)
        reloaded = load()
        # what Dagster's run retry does with the failed run's selection
        job = reloaded.resolve_implicit_global_asset_job_def()
        assert job.get_subset(asset_selection={alpha, beta}).asset_layer.executable_asset_keys == {alpha, beta}
        spec = {s.key: s for s in reloaded.resolve_all_asset_specs()}[beta]
        assert "DROPPED" in (spec.description or "")
        # nothing lands for it any more, and that is not a failure: no freshness policy, no automation
        specs = {s.key: s for s in reloaded.resolve_all_asset_specs()}
        for kind in ("slices", "changelog", "current_state"):
            kept = specs[AssetKey([db.name, "beta", kind])]
            assert kept.freshness_policy is None and kept.automation_condition is None, kind
        assert specs[AssetKey([db.name, "alpha", "current_state"])].freshness_policy is not None
        assert datetime.fromisoformat(spec.metadata["mongocdc/dropped_at"]) >= dropped_at - timedelta(minutes=1)
        assert "mongocdc/dropped_at" not in {s.key: s for s in reloaded.resolve_all_asset_specs()}[alpha].metadata
        schedule = reloaded.resolve_schedule_def("mongocdc_latest_window")

        def selection(at: datetime) -> set[AssetKey]:
            with build_schedule_context(instance=instance, scheduled_execution_time=at,
                                        repository_def=reloaded.get_repository_def()) as context:
                result = schedule.evaluate_tick(context)
                assert result.run_requests, result.skip_message
                (request,) = result.run_requests
            return set(request.asset_selection or ())

        assert selection(dropped_at) == {alpha, beta}  # the window it was dropped in (or before) still lands it
        assert selection(dropped_at + timedelta(minutes=3)) == {alpha}  # later windows: no new slices for it
        db.create_collection("gamma")
        assert {alpha, beta, AssetKey([db.name, "gamma", "slices"])} <= set(load().resolve_all_asset_keys())  # kept


def test_a_dropped_collections_table_is_not_reconciled_with_a_collection_that_is_gone(
        tmp_path: Path, mongo_uri: str, db: Database[Any]) -> None:
    """A dropped collection's current_state stays (its assets are kept): the blocking ``matches_source`` passes
    saying there is no collection to compare it with (nothing is wrong), not that the table differs from an
    empty source, nor a warning for the days its assets stay."""
    db.gone.insert_many([{"_id": i} for i in range(3)])
    env = make_env(tmp_path, mongo_uri, db, ["gone"])
    state_key = env.key("gone", "current_state")
    with instance_for_test() as instance:
        assert env.materialize(instance, [env.key("gone", k) for k in ("snapshot", "changelog", "current_state")]).success
        db.drop_collection("gone")
        dropped = replace(env.state, collections=tuple(replace(c, dropped_at=datetime.now(UTC))
                                                       for c in env.state.collections))
        check = AssetCheckKey(state_key, "matches_source")
        defs = Definitions.merge(build_definitions(env.settings, dropped),
                                 Definitions(jobs=[define_asset_job("reconcile", AssetSelection.checks(check))]))
        result = defs.resolve_job_def("reconcile").execute_in_process(instance=instance, raise_on_error=False)
    (evaluation,) = result.get_asset_check_evaluations()
    assert evaluation.passed
    assert evaluation.metadata["verdict"].value == "dropped" and "no collection to compare" in (
        evaluation.description or "")
