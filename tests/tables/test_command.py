"""``mongocdc tables`` for users without Dagster: the real CLI, as a cron job would run it.

``mongocdc run`` lands two collections' events as Parquet (snapshot, then changes, stopped at a cluster
time taken after the writes); ``mongocdc tables refresh`` finds both collections in the landing zone and
builds their tables; ``check`` passes on them and fails (exit 1) once a row is corrupted; ``maintain``
compacts. Every command writes one line per event to a file (no wrapping, no bars), with a summary.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from delta.tables import DeltaTable
from pymongo.database import Database
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from mongocdc_core.tables.command import build_parser

BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _mongocdc(args: list[str], tmp: Path, name: str) -> tuple[int, list[str]]:
    err = tmp / f"{name}.log"
    with open(err, "w") as stderr:
        done = subprocess.run([str(BIN / "mongocdc"), *args], stdout=subprocess.DEVNULL, stderr=stderr, timeout=900,
                              check=False)
    return done.returncode, err.read_text().splitlines()


def _now(db: Database) -> str:
    """The cluster time after every write so far, as ``--stop-at`` takes it."""
    ts = db.client.admin.command("hello")["$clusterTime"]["clusterTime"]
    return f"{ts.time}:{ts.inc}"


def test_refresh_check_and_maintain_from_the_command_line(spark: SparkSession, tmp_path: Path, mongo_uri: str,
                                                          fresh_db: Database) -> None:
    db = fresh_db.name
    fresh_db.orders.insert_many([{"_id": i, "qty": i, "tags": ["a", str(i)]} for i in range(1, 31)])
    fresh_db.customers.insert_many([{"_id": f"c{i}", "name": f"n{i}"} for i in range(1, 6)])
    config = tmp_path / "connector.json"
    config.write_text(json.dumps({"name": "t", "config": {
        "mongodb.connection.string": mongo_uri, "topic.prefix": "cli", "collection.include.list": rf"{db}\..*"}}))
    landing, tables = tmp_path / "landing", tmp_path / "tables"

    code, lines = _mongocdc(["run", "--config", str(config), "--sink", f"parquet:{landing}", "--offsets",
                             str(tmp_path / "offsets.json"), "--stop-at", _now(fresh_db)], tmp_path, "run1")
    assert code == 0, lines
    fresh_db.orders.update_one({"_id": 1}, {"$set": {"qty": 100}})
    fresh_db.orders.delete_one({"_id": 2})
    fresh_db.customers.insert_one({"_id": "c9", "name": "late"})
    fresh_db.orders.insert_one({"_id": 99, "qty": -0.0})
    code, lines = _mongocdc(["run", "--config", str(config), "--sink", f"parquet:{landing}", "--offsets",
                             str(tmp_path / "offsets.json"), "--stop-at", _now(fresh_db)], tmp_path, "run2")
    assert code == 0, lines

    code, lines = _mongocdc(["tables", "refresh", "--landing", str(landing), "--tables", str(tables)], tmp_path,
                            "refresh")
    assert code == 0, lines
    assert any("of 2 collections; refreshing 2" in line for line in lines), lines
    done = [line for line in lines if " done  " in line]
    assert len(done) == 2 and all("current_state" in line for line in done), lines
    assert any(line.split(" ", 2)[2].startswith("mongocdc.tables: refresh: 2 of 2 collections done, 0 failed")
               for line in lines), lines
    # one plain line per event, Spark's start-up chatter kept out (its log goes where MONGOCDC_SPARK_LOG says)
    assert all(line[:4].isdigit() and " INFO mongocdc." in line and "\x1b[" not in line for line in lines), lines
    orders = spark.read.format("delta").load(str(tables / f"{db}__orders__current"))
    assert orders.count() == 30 and orders.where(F.col("_id") == "1").first()["qty"] == 100

    code, lines = _mongocdc(["tables", "check", "--config", str(config), "--tables", str(tables)], tmp_path, "check")
    assert code == 0, lines
    passed = [line for line in lines if "PASS  " in line]
    assert all("keys compared (100%); matches" in line for line in passed), lines
    assert {p.split("PASS  ")[1].split(" ")[0] for p in passed} == {f"{db}.orders", f"{db}.customers"}, lines

    DeltaTable.forPath(spark, str(tables / f"{db}__customers__current")).update(
        F.col("_id") == "c3", {"name": F.lit("corrupted")})
    code, lines = _mongocdc(["tables", "check", "--config", str(config), "--tables", str(tables), "--collection",
                             f"{db}.cust*"], tmp_path, "corrupted")
    assert code == 1, lines
    failed = [line for line in lines if "FAIL  " in line]
    assert len(failed) == 1 and f"{db}.customers" in failed[0] and "DIFFERS at 1 key(s)" in failed[0], lines
    assert "6 of 6 keys compared (100%)" in failed[0], lines
    # the update left a deletion vector: Delta's harmless ERROR on each scan of such a table is not printed
    # (mongocdc's log4j2 profile turns its logger off)
    assert not any("Failed to translate filter" in line for line in lines), lines

    code, lines = _mongocdc(["tables", "maintain", "--tables", tables.as_uri(), "--collection", f"{db}.orders"],
                            tmp_path, "maintain")
    assert code == 0, lines
    assert any("changelog_files_added" in line for line in lines), lines

    # a pattern that chooses no table is the user's mistake, named with the collections there are
    code, lines = _mongocdc(["tables", "maintain", "--tables", str(tables), "--collection", f"{db}.order"], tmp_path,
                            "unknown")
    assert code == 2, lines
    assert lines[-1].endswith(f"mongocdc tables maintain: --collection '{db}.order' matches no collection with "
                              f"tables under {tables} (there: {db}.customers, {db}.orders)"), lines


def test_a_landing_zone_that_does_not_exist_is_a_clear_error(tmp_path: Path) -> None:
    code, lines = _mongocdc(["tables", "refresh", "--landing", str(tmp_path / "nope"), "--tables",
                             str(tmp_path / "t")], tmp_path, "missing")
    assert code == 2
    assert any("landing-zone path does not exist" in line for line in lines) and not any(
        "Traceback" in line for line in lines), lines


def _landing_of(tmp_path: Path, *namespaces: str) -> Path:
    """A landing zone holding one file per collection (the ``collection`` column is what tells them apart)."""
    landing = tmp_path / "landing"
    landing.mkdir()
    for n, namespace in enumerate(namespaces):
        pq.write_table(pa.table({"collection": [namespace] * 2, "key": ["1", "2"]}), landing / f"part-{n}.parquet")
    return landing


def test_an_unknown_collection_is_a_usage_error_before_spark_starts(tmp_path: Path) -> None:
    landing, tables = _landing_of(tmp_path, "inventory.orders", "inventory.customers"), tmp_path / "tables"
    code, lines = _mongocdc(["tables", "refresh", "--landing", landing.as_uri(), "--tables", str(tables),
                             "--collection", "inventory.orders", "--collection", "inventory.cust", "--collection",
                             "Inventory.*"], tmp_path, "unknown")
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].endswith(
        f"ERROR mongocdc.tables: mongocdc tables refresh: --collection 'inventory.cust', 'Inventory.*' matches no "
        f"collection in the landing zone {landing} (there: inventory.customers, inventory.orders)"), lines
    assert not tables.exists()  # no Spark: its log would be there


def test_an_empty_landing_zone_is_said_without_starting_spark(tmp_path: Path) -> None:
    landing, tables = tmp_path / "landing", tmp_path / "tables"
    landing.mkdir()
    code, lines = _mongocdc(["tables", "refresh", "--landing", str(landing), "--tables", str(tables)], tmp_path, "empty")
    assert code == 1 and any("refresh: no collection selected" in line for line in lines), lines
    assert not tables.exists() and not any("starting Spark" in line for line in lines), lines  # no Spark: no log there


def test_tables_elsewhere_than_this_machine_are_not_listed_here_before_spark_starts(tmp_path: Path) -> None:
    code, lines = _mongocdc(["tables", "refresh", "--landing", "s3a://bucket/landing", "--tables",
                             "s3a://bucket/tables"], tmp_path, "remote")
    assert code == 2 and len(lines) == 1, lines
    assert "--landing s3a://bucket/landing: the landing zone is listed on this machine" in lines[0]
    code, lines = _mongocdc(["tables", "maintain", "--tables", str(tmp_path / "none")], tmp_path, "no-tables")
    assert code == 2 and len(lines) == 1 and f"no tables under {tmp_path / 'none'}: it is not a directory" in lines[0]


@pytest.mark.parametrize(("given", "taken"), [
    ("s3a://bucket/cdc/tables", "s3a://bucket/cdc/tables"),
    ("abfss://lake@account.dfs.core.windows.net/tables", "abfss://lake@account.dfs.core.windows.net/tables"),
    ("file:///data/my%20tables", "/data/my tables"),
    ("/data/tables", "/data/tables"),
])
def test_table_locations_are_taken_as_spark_reads_them(given: str, taken: str) -> None:
    assert build_parser().parse_args(["maintain", "--tables", given]).tables == taken
