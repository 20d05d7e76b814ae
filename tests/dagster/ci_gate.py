"""CI: the headless asset checks gate a deploy (``python -m tests.dagster.ci_gate``, after ``make demo``).

It reopens the demo's data (the emulator on ``.local/demo/mongo``, as ``make demo`` left it), builds the
tables of every demo collection through the Dagster assets (snapshot -> changelog -> current_state) on a
fresh instance, and runs ``mongocdc check`` twice: on the correct tables it must exit 0; after one row of
``inventory.customers``' current_state is corrupted it must exit 1 and print a FAIL line for that table.
Exits 0 when both hold.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson
from dagster import AssetsDefinition, DagsterInstance, materialize
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from mongocdc_core.tables import spark_session
from mongocdc_dagster import local_stack
from mongocdc_dagster.build import build_definitions
from mongocdc_dagster.discovery import discover
from mongocdc_dagster.resources import MongoCdcResource
from mongocdc_dagster.settings import CdcSettings
from mongocdc_devstack.fixture import EmulatedReplicaSet

DEMO = local_stack.REPO_ROOT / ".local" / "demo"
CORRUPTED = "inventory.customers"


def _check(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(Path(sys.executable).parent / "mongocdc"), "check", "--collection", "inventory.*"],
                            cwd=local_stack.REPO_ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    print(result.stdout, end="", flush=True)
    print(result.stderr[-3000:], end="", file=sys.stderr, flush=True)
    return result


def main() -> int:
    if not (DEMO / "mongo").is_dir():
        print(f"ci_gate: no demo data at {DEMO / 'mongo'}: run `make demo` first", file=sys.stderr)
        return 2
    with EmulatedReplicaSet(in_process=False, dbpath=str(DEMO / "mongo"), noop_interval=1.0) as rs, \
            tempfile.TemporaryDirectory(prefix="mongocdc-ci-gate-") as tmp:
        home = Path(tmp)
        config = home / "connector.json"
        config.write_bytes(orjson.dumps({"name": "ci-gate", "config": {
            "mongodb.connection.string": rs.uri, "topic.prefix": "demo", "collection.include.list": r"inventory\..*"}}))
        dagster_home = local_stack.prepare_dagster_home(home / "dagster")
        env = {**os.environ, "DAGSTER_HOME": str(dagster_home), "MONGOCDC_CONFIG": str(config),
               "MONGOCDC_HOME": str(home / "cdc")}
        settings = CdcSettings.from_env(env)
        state = discover(MongoCdcResource.for_load(settings))
        if state.error or not state.namespaces:
            print(f"ci_gate: the demo data has no collections ({state.error})", file=sys.stderr)
            return 2
        defs = build_definitions(settings, state)
        assets = [a for a in defs.assets or [] if isinstance(a, AssetsDefinition)]
        wanted = [spec.key for spec in defs.resolve_all_asset_specs()
                  if spec.tags.get("mongocdc/kind") in ("snapshot", "changelog", "current_state")]
        with DagsterInstance.from_config(str(dagster_home)) as instance:
            built = materialize(assets, selection=wanted, resources=dict(defs.resources or {}), instance=instance,
                                raise_on_error=False)
        if not built.success:
            print("ci_gate: building the demo tables through Dagster failed", file=sys.stderr)
            return 1
        print(f"ci_gate: tables of {', '.join(state.namespaces)} built; checks on correct tables:", flush=True)
        clean = _check(env)
        db, _, coll = CORRUPTED.partition(".")
        table = str(home / "cdc" / "tables" / f"{db}__{coll}__current")
        spark = spark_session("local[2]")
        victim = spark.read.format("delta").load(table).orderBy("_id").first()
        assert victim is not None
        DeltaTable.forPath(spark, table).update(F.col("_id") == victim["_id"], {"__doc": F.parse_json(F.lit('{"_id": "corrupted"}'))})
        spark.stop()
        print(f"ci_gate: corrupted {CORRUPTED} row _id={victim['_id']}; checks again:", flush=True)
        broken = _check(env)
    failed_line = any(line.startswith("FAIL") and f"{db}/{coll}/current_state" in line
                      for line in broken.stdout.splitlines())
    verdicts = [
        (clean.returncode == 0, f"correct tables: exit {clean.returncode} (expected 0)"),
        (broken.returncode == 1 and failed_line,
         f"corrupted {CORRUPTED}: exit {broken.returncode} (expected 1) with a FAIL line: {failed_line}"),
    ]
    for ok, text in verdicts:
        print(f"ci_gate: {'ok  ' if ok else 'WRONG'} {text}", flush=True)
    return 0 if all(ok for ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
