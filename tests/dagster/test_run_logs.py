"""A Dagster run's logs as the UI and a log shipper meet them: a run executed in a real instance (the
project's dagster.yaml, as ``make dev`` writes it) by Dagster's CLI or its run worker, in a process of its own,
stderr in a file.

mongocdc's own log records (its loggers ``mongocdc`` and ``mongocdc_core``) are part of the run's event
log; a run writes one line per event, or one JSON object per line with ``MONGOCDC_LOG_FORMAT=json`` (a
notification's fields as fields), whether its config names the ``console`` logger or, as a run launched
from the UI or by the declarative automation, names no logger (the implicit asset job, empty run config).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from dagster import AssetKey, DagsterInstance, DagsterRunStatus
from dagster._core.definitions.assets.job.asset_job import IMPLICIT_ASSET_JOB_NAME
from dagster._core.definitions.reconstruct import ReconstructableJob, ReconstructableRepository
from dagster._core.storage.tags import AUTOMATION_CONDITION_TAG
from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value
from pymongo.database import Database

from mongocdc_dagster import local_stack

BIN = Path(sys.executable).parent
NOTIFICATION = "Notification from "
# The head of every event in text logs off a terminal (as in tests/test_cli_logs.py).
EVENT_HEAD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) dagster: ")


def _deployment(tmp_path: Path, uri: str, db: Database[Any], log_format: str | None) -> dict[str, str]:
    """The environment of a deployment of one collection with five documents (its notifications on the log
    channel, no tables), on an instance as ``make dev`` writes it, ``log_format`` in ``MONGOCDC_LOG_FORMAT``."""
    db.items.insert_many([{"_id": i, "name": f"item {i}"} for i in range(5)])
    db.create_collection("signals")
    config = tmp_path / "connector.json"
    config.write_bytes(orjson.dumps({"name": "logs-test", "config": {
        "mongodb.connection.string": uri, "topic.prefix": "logsrv", "database.include.list": db.name,
        "collection.include.list": f"{db.name}.items", "signal.data.collection": f"{db.name}.signals",
        "notification.enabled.channels": "log",
    }}))
    dagster_home = local_stack.prepare_dagster_home(tmp_path / "dagster_home")
    env = {k: v for k, v in os.environ.items() if k != "MONGOCDC_LOG_FORMAT"}
    env.update(DAGSTER_HOME=str(dagster_home), MONGOCDC_CONFIG=str(config), MONGOCDC_HOME=str(tmp_path / "home"),
               MONGOCDC_TABLES_ENABLED="false", **({"MONGOCDC_LOG_FORMAT": log_format} if log_format else {}))
    return env


def _materialise_snapshot(tmp_path: Path, uri: str, db: Database[Any], log_format: str | None = None,
                          run_config: dict[str, Any] | None = None,
                          extra_env: dict[str, str] | None = None) -> tuple[str, str]:
    """Materialise the collection's incremental snapshot (``_deployment``) with ``dagster asset materialize``
    (``run_config`` naming mongocdc's console logger); return the run's id and what its process wrote to stderr."""
    env = {**_deployment(tmp_path, uri, db, log_format), **(extra_env or {})}
    dagster_home = Path(env["DAGSTER_HOME"])
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        done = subprocess.run(
            [str(BIN / "dagster"), "asset", "materialize", "-m", "mongocdc_dagster.definitions",
             "--select", f"{db.name}/items/incremental_snapshot",
             *(["--config-json", orjson.dumps(run_config).decode()] if run_config else [])],
            cwd=local_stack.REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, timeout=600)
    text = stderr_path.read_text()
    assert done.returncode == 0, text
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = instance.get_runs()
    assert [r.status for r in runs] == [DagsterRunStatus.SUCCESS], text
    return runs[0].run_id, text


def test_mongocdcs_log_records_are_in_the_runs_event_log(tmp_path: Path, mongo_uri: str,
                                                       fresh_db: Database[Any]) -> None:
    # no run config (the implicit asset job, as the UI and the automation sensor launch it), JSON logs
    run_id, stderr = _materialise_snapshot(tmp_path, mongo_uri, fresh_db, "json")
    lines = [orjson.loads(line) for line in _from_the_run_on(stderr, run_id)]  # every line one JSON object
    assert len(lines) > 5 and all(e["run_id"] == run_id and e["logger"] == "dagster" for e in lines), stderr
    with DagsterInstance.from_config(str(tmp_path / "dagster_home")) as instance:
        records = instance.all_logs(run_id)
    # the engine's notifications (mongocdc_core.notifications, INFO) are the run's, as the UI shows them
    notifications = [orjson.loads(r.user_message.split(": ", 1)[1])
                     for r in records if r.user_message.startswith(NOTIFICATION)]
    kinds = [n["type"] for n in notifications]
    assert kinds and kinds[0] == "STARTED" and kinds[-1] == "COMPLETED", stderr
    assert {n["aggregate_type"] for n in notifications} == {"Incremental Snapshot"}
    # and the snapshot's progress lines (mongocdc_core's LogProgress through context.log) next to them
    assert any(r.user_message.startswith(f"snapshot of {fresh_db.name}.items copied 5 documents") for r in records)


def _from_the_run_on(text: str, run_id: str) -> list[str]:
    """stderr's lines from the run's first event on (before it: Python's warnings as Dagster loads the code)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if run_id in line)
    return lines[first:]


def test_a_runs_console_lines_to_a_file_are_one_line_per_event(tmp_path: Path, mongo_uri: str,
                                                               fresh_db: Database[Any]) -> None:
    # no run config, as the UI's Materialize and the automation sensor launch the implicit asset job
    run_id, text = _materialise_snapshot(tmp_path, mongo_uri, fresh_db)
    lines = _from_the_run_on(text, run_id)
    assert len(lines) > 5 and "\x1b[" not in text
    assert [line for line in lines if not EVENT_HEAD.match(line)] == []
    notifications = [orjson.loads(line.split(NOTIFICATION, 1)[1].split(": ", 1)[1])
                     for line in lines if NOTIFICATION in line]
    assert [n["type"] for n in notifications][-1] == "COMPLETED", lines
    # from INFO on by default: the run's own messages, not Dagster's DEBUG events
    assert not any(" - RUN_SUCCESS - " in line for line in lines), lines


def test_dagsters_own_console_is_kept_when_the_deployment_asks(tmp_path: Path, mongo_uri: str,
                                                               fresh_db: Database[Any]) -> None:
    run_id, text = _materialise_snapshot(tmp_path, mongo_uri, fresh_db,
                                         extra_env={"MONGOCDC_DAGSTER_RUN_LOGS": "dagster"})
    lines = _from_the_run_on(text, run_id)
    assert any(f" - dagster - INFO - __ASSET_JOB - {run_id} - " in line for line in lines), lines
    assert not any(EVENT_HEAD.match(line) for line in lines), lines


def test_a_runs_json_console_lines_carry_the_run_and_the_notifications_fields(
        tmp_path: Path, mongo_uri: str, fresh_db: Database[Any]) -> None:
    # the run's config names the logger (to show Dagster's DEBUG events too)
    run_id, text = _materialise_snapshot(tmp_path, mongo_uri, fresh_db, "json",
                                         run_config={"loggers": {"console": {"config": {"log_level": "DEBUG"}}}})
    events = [orjson.loads(line) for line in _from_the_run_on(text, run_id)]  # every line one JSON object
    assert len(events) > 5 and all(e["run_id"] == run_id and e["logger"] == "dagster" for e in events)
    assert {"timestamp", "level", "message", "job", "step_key"} <= {k for e in events for k in e}
    notifications = [e for e in events if "notification" in e]
    assert [e["notification"]["type"] for e in notifications][-1] == "COMPLETED", events
    assert {e["notification"]["aggregate_type"] for e in notifications} == {"Incremental Snapshot"}
    assert all(e["message"].startswith(NOTIFICATION) for e in notifications)
    assert [e["event_type"] for e in events if "event_type" in e][-1] == "RUN_SUCCESS"


def test_a_bad_log_format_fails_the_run_naming_the_variable(tmp_path: Path, mongo_uri: str,
                                                            fresh_db: Database[Any]) -> None:
    with pytest.raises(AssertionError, match="MONGOCDC_LOG_FORMAT: expected one of text, json, got 'xml'"):
        _materialise_snapshot(tmp_path, mongo_uri, fresh_db, "xml")


def test_a_run_of_the_automation_or_the_ui_in_dagsters_run_worker_writes_mongocdcs_lines(
        tmp_path: Path, mongo_uri: str, fresh_db: Database[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A run as the automation sensor and the UI create theirs (the implicit asset job, no run config),
    executed by the process the run launcher starts for it (``dagster api execute_run``)."""
    env = _deployment(tmp_path, mongo_uri, fresh_db, None)
    for name in ("DAGSTER_HOME", "MONGOCDC_CONFIG", "MONGOCDC_HOME", "MONGOCDC_TABLES_ENABLED"):
        monkeypatch.setenv(name, env[name])  # the code location loads here too, to make the run
    job = ReconstructableJob(ReconstructableRepository.for_module(
        "mongocdc_dagster.definitions", "defs", str(local_stack.REPO_ROOT)), IMPLICIT_ASSET_JOB_NAME)
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        run = instance.create_run_for_job(
            job.get_definition(), run_config={}, job_code_origin=job.get_python_origin(),
            asset_selection={AssetKey([fresh_db.name, "items", "incremental_snapshot"])},
            tags={AUTOMATION_CONDITION_TAG: "true"})
        worker_args = serialize_value(ExecuteRunArgs(job_origin=job.get_python_origin(), run_id=run.run_id,
                                                     instance_ref=instance.get_ref(), set_exit_code_on_failure=True))
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        done = subprocess.run([str(BIN / "dagster"), "api", "execute_run", worker_args], cwd=local_stack.REPO_ROOT,
                              env=env, stdout=subprocess.DEVNULL, stderr=stderr, timeout=600)
    text = stderr_path.read_text()
    assert done.returncode == 0, text
    with DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.get_run_by_id(run.run_id).status == DagsterRunStatus.SUCCESS, text  # type: ignore[union-attr]
    lines = _from_the_run_on(text, run.run_id)
    assert len(lines) > 5 and "\x1b[" not in text
    assert [line for line in lines if not EVENT_HEAD.match(line)] == []
    assert any(NOTIFICATION in line for line in lines), lines


# A code location whose check logs as mongocdc's do: through context.log, and a warning of the engine's;
# loading it warns as Dagster's beta parameters do.
_CHECKED_LOCATION = """
import logging
import warnings
from dagster import AssetCheckResult, AssetSpec, Definitions, asset_check
from mongocdc_dagster.logs import LOGGERS

warnings.warn("a parameter in beta")

@asset_check(asset="items", blocking=True)
def counted(context):
    context.log.info("counted 5 documents")
    logging.getLogger("mongocdc_core.checks").warning("a warning of the engine's")
    return AssetCheckResult(passed=True)

defs = Definitions(assets=[AssetSpec("items")], asset_checks=[counted], loggers=LOGGERS)
"""


def test_mongocdc_checks_log_format_option_wins_over_the_environment(tmp_path: Path) -> None:
    (tmp_path / "checked_location.py").write_text(_CHECKED_LOCATION)
    dagster_home = local_stack.prepare_dagster_home(tmp_path / "dagster_home")  # its python_logs capture mongocdc_core
    env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "MONGOCDC_LOG_FORMAT": "text",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        done = subprocess.run([sys.executable, "-m", "mongocdc_dagster.check_cli", "-m", "checked_location:defs",
                               "--log-format", "json"],
                              cwd=local_stack.REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, timeout=300)
    text = stderr_path.read_text()
    assert done.returncode == 0 and b"1 check(s), 0 blocking failure(s)" in done.stdout, text
    with DagsterInstance.from_config(str(dagster_home)) as instance:
        (run,) = instance.get_runs()
    events = [orjson.loads(line) for line in text.splitlines()]  # every line one JSON object, Python's warnings too
    of_the_run = [e["message"] for e in events if e.get("run_id") == run.run_id]
    assert of_the_run == ["counted 5 documents", "a warning of the engine's"], text
    assert sum("a warning of the engine's" in e["message"] for e in events) == 1, text  # the run's line only
    assert [e["logger"] for e in events if "a parameter in beta" in e["message"]] == ["py.warnings"]
