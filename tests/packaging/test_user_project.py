"""A data team's own Dagster project, outside this checkout, with mongocdc from its wheels.

The wheels are built from this checkout (``make wheels``: mongocdc and mongocdc-native), installed with
``pip install 'mongocdc[all]'`` into a new virtual environment in a temporary directory (dependencies
from the package index), and a ``dg`` project of the user's is scaffolded there with ``dg scaffold defs
mongocdc_dagster.MongoCdcComponent``. Against the emulator that the same install provides, one
collection goes end to end by the command line (snapshot, then the slice windows up to a cluster time
taken after the writes, then its tables) and ``mongocdc check`` passes. A second venv with only
``mongocdc[devstack]`` (no Spark, no Dagster) fetches the local Kafka broker's jars with ``mongocdc kafka
jars``, starts the broker and captures a collection into it with ``mongocdc run``. Nothing imports this
checkout: PYTHONPATH is cleared and every command runs outside it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from bson.timestamp import Timestamp
from confluent_kafka import Consumer, KafkaError
from pymongo import MongoClient

REPO = Path(__file__).resolve().parents[2]
PY = Path(sys.executable)

pytestmark = [pytest.mark.slow, pytest.mark.packaging, pytest.mark.timeout(1800)]


#: pip's options for the user's installs: no byte-compiling of every installed module (Python compiles what it
#: imports; on two cores that is a third of an install of mongocdc[all], and it changes nothing the tests see).
_PIP_INSTALL = ("--quiet", "--no-compile")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{' '.join(args)} -> {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return done


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """Wheels built, installed into a fresh venv outside the checkout; yields the paths a user has."""
    root = tmp_path_factory.mktemp("user")
    dist, venv = root / "dist", root / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([str(PY), "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dist), str(REPO),
          str(REPO / "native")], root, env)
    wheels = sorted(p.name for p in dist.glob("*.whl"))
    assert [w.split("-")[0] for w in wheels] == ["mongocdc", "mongocdc_native"], wheels
    base = Path(getattr(sys, "_base_executable", sys.executable))
    _run([str(base), "-m", "venv", str(venv)], root, env)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", *_PIP_INSTALL, "--find-links", str(dist),
          "mongocdc[all]"], root, env, timeout=1500)
    yield {"root": root, "venv": venv, "env_path": venv / "bin"}


def test_the_installed_package_has_the_compiled_module(user: dict[str, Path]) -> None:
    probe = subprocess.run([str(user["venv"] / "bin" / "python"), "-c",
                            "import mongocdc_native, mongocdc_core, sys; print(mongocdc_core.__file__); "
                            "print(mongocdc_native.__file__)"],
                           cwd=user["root"], capture_output=True, text=True, timeout=120,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert probe.returncode == 0, probe.stderr
    assert probe.stderr == "", "no 'converting in Python' line: the compiled module is there"
    for path in probe.stdout.split():
        assert path.startswith(str(user["venv"])), path


@pytest.fixture(scope="module")
def devstack_user(user: dict[str, Path]) -> dict[str, Path]:
    """The same wheels in another fresh venv with only ``mongocdc[devstack]``: the core and the development
    stand-ins, neither Spark nor Dagster."""
    root = user["root"] / "devstack"
    venv = root / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    root.mkdir()
    _run([str(Path(getattr(sys, "_base_executable", sys.executable))), "-m", "venv", str(venv)], root, env)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", *_PIP_INSTALL, "--find-links", str(user["root"] / "dist"),
          "mongocdc[devstack]"], root, env, timeout=1500)
    return {"root": root, "venv": venv, "env_path": venv / "bin"}


def _user_env(user: dict[str, Path]) -> dict[str, str]:
    """A pip user's environment: the new venv first on PATH, nothing of this checkout, an empty user cache."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("MONGOCDC_")}
    return env | {"VIRTUAL_ENV": str(user["venv"]), "PATH": f"{user['env_path']}:{env['PATH']}",
                  "XDG_CACHE_HOME": str(user["root"] / "cache")}


def _started(args: list[str], cwd: Path, env: dict[str, str], ready: str) -> subprocess.Popen[str]:
    """A server command, once it printed its ready line on stdout (it prints it or exits)."""
    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if not line.startswith(ready):
        proc.kill()
        raise AssertionError(f"{' '.join(args)}: {line!r}\n{proc.stderr.read()[-4000:]}")
    return proc


def _stop(proc: subprocess.Popen[str]) -> int:
    proc.terminate()
    try:
        return proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def test_devstack_alone_captures_to_its_kafka_broker_from_jars_it_fetched(devstack_user: dict[str, Path]) -> None:
    """``pip install 'mongocdc[devstack]'``: no Spark, no Dagster; the broker says how to get its jars, gets
    them with ``mongocdc kafka jars`` from Maven Central into the user cache and starts from there, and
    ``mongocdc run`` captures the emulator's collection into it."""
    root, bin_ = devstack_user["root"], devstack_user["env_path"]
    mongocdc, env = str(bin_ / "mongocdc"), _user_env(devstack_user)
    for absent in ("pyspark", "dagster"):
        probe = subprocess.run([str(bin_ / "python"), "-c", f"import {absent}"], cwd=root, env=env,
                               capture_output=True, text=True, timeout=120, check=False)
        assert probe.returncode == 1 and "ModuleNotFoundError" in probe.stderr, f"{absent} came with [devstack]"
    tables = subprocess.run([mongocdc, "tables", "refresh"], cwd=root, env=env, capture_output=True, text=True,
                            timeout=120, check=False)
    assert tables.returncode == 2 and "install 'mongocdc[spark]'" in tables.stderr, tables.stderr

    kafka_port = _free_port()
    broker = [mongocdc, "kafka", "--port", str(kafka_port), "--data-dir", str(root / "kafka")]
    without = subprocess.run(broker, cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert without.returncode == 1, without.stderr
    cache = root / "cache" / "mongocdc" / "kafka-jars"
    assert f"MONGOCDC_KAFKA_JARS is not set and {cache} does not hold them" in without.stderr, without.stderr
    for way in (f"run `mongocdc kafka jars` (downloads them from https://repo1.maven.org/maven2 into {cache}",
                "or set MONGOCDC_KAFKA_JARS to a directory holding them"):
        assert way in without.stderr, without.stderr
    assert "make setup" not in without.stderr, "a wheel is not a checkout"
    assert len(without.stderr.splitlines()) == 1, "one event, one line"

    fetched = _run([mongocdc, "kafka", "jars"], root, env, timeout=600)
    count = len(list(cache.glob("*.jar")))
    assert count == 45 and f"[{count}/{count}] " in fetched.stderr and not list(cache.glob("*.part"))
    checkout = REPO / ".jars" / "kafka"
    if checkout.is_dir():  # `make setup`'s Maven copied the very same files from the same pom
        assert sorted(p.name for p in checkout.glob("*.jar")) == sorted(p.name for p in cache.glob("*.jar"))
        for jar in cache.glob("*.jar"):
            assert jar.read_bytes() == (checkout / jar.name).read_bytes(), jar.name

    mongo_port = _free_port()
    servers = [_started(broker, root, env, f"Kafka broker ready at 127.0.0.1:{kafka_port}")]
    try:
        servers.append(_started([mongocdc, "emulator", "--port", str(mongo_port), "--replset", "rs0",
                                 "--noop-interval", "1"], root, env, "mongocdc emulator listening"))
        uri = f"mongodb://127.0.0.1:{mongo_port}/?replicaSet=rs0"
        with MongoClient(uri, serverSelectionTimeoutMS=60_000) as client:
            client.shop.items.insert_many([{"_id": i, "name": f"item {i}"} for i in range(3)])
        (root / "connector.properties").write_text(
            f"mongodb.connection.string={uri}\ntopic.prefix=user\ncollection.include.list=shop\\.items\n")
        _run([mongocdc, "run", "--config", str(root / "connector.properties"), "--sink",
              f"kafka:127.0.0.1:{kafka_port}", "--offsets", str(root / "offsets.json"), "--until-idle", "2"],
             root, env, timeout=600)
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{kafka_port}", "group.id": "user",
                             "auto.offset.reset": "earliest", "enable.partition.eof": True})
        consumer.subscribe(["user.shop.items"])
        keys: list[str] = []
        while True:  # bounded by the test's timeout; the topic ends after what the run delivered
            message = consumer.poll(5)
            if message is None:
                continue
            if message.error() is not None:
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                break
            keys.append(json.loads(message.key() or b"{}")["payload"]["id"])
        consumer.close()
        assert sorted(keys) == ["0", "1", "2"]
    finally:
        codes = [_stop(proc) for proc in reversed(servers)]
    assert codes == [0] * len(servers), "the emulator and the broker stop cleanly on SIGTERM"


PROJECT_TOML = """[project]
name = "cdc-project"
version = "0.1.0"
requires-python = ">=3.11"

[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[tool.dg]
directory_type = "project"

[tool.dg.project]
root_module = "cdc_project"
"""


def _cluster_time(client: MongoClient[dict[str, object]]) -> Timestamp:
    reply = client.admin.command("hello")
    ts = reply["$clusterTime"]["clusterTime"]
    assert isinstance(ts, Timestamp)
    return ts


def test_a_users_project_takes_one_collection_end_to_end(user: dict[str, Path]) -> None:
    root, venv = user["root"], user["venv"]
    project = root / "cdc-project"
    (project / "cdc_project" / "defs").mkdir(parents=True)
    (project / "pyproject.toml").write_text(PROJECT_TOML)
    (project / "cdc_project" / "__init__.py").write_text("")
    (project / "cdc_project" / "defs" / "__init__.py").write_text("")
    (project / "cdc_project" / "definitions.py").write_text(
        "from pathlib import Path\n\nfrom dagster import Definitions, definitions, load_from_defs_folder\n\n\n"
        "@definitions\ndef defs() -> Definitions:\n"
        "    return load_from_defs_folder(path_within_project=Path(__file__).parent)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith("MONGOCDC_")}
    env |= {"VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:{env['PATH']}",
            "DAGSTER_HOME": str(root / "dagster-home"), "MONGOCDC_SPARK_JARS": str(root / "spark-jars")}
    (root / "dagster-home").mkdir()
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "-e", str(project)],
         project, env)
    bin_ = venv / "bin"
    _run([str(bin_ / "mongocdc"), "tables", "jars", "--dir", str(root / "spark-jars")], project, env)
    _run([str(bin_ / "dg"), "scaffold", "defs", "mongocdc_dagster.MongoCdcComponent", "cdc"], project, env)
    component = project / "cdc_project" / "defs" / "cdc"
    assert "type: mongocdc_dagster.MongoCdcComponent" in (component / "defs.yaml").read_text()

    port = _free_port()
    emulator = subprocess.Popen([str(bin_ / "mongocdc"), "emulator", "--port", str(port), "--replset", "rs0",
                                 "--noop-interval", "1", "--dbpath", str(root / "mongo")],
                                cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    uri = f"mongodb://127.0.0.1:{port}/?replicaSet=rs0"
    try:
        client: MongoClient[dict[str, object]] = MongoClient(uri, serverSelectionTimeoutMS=60_000)
        customers = client.inventory.customers
        customers.insert_many([{"_id": i, "name": f"c{i}", "tier": i % 3} for i in range(1, 21)])
        config = json.loads((component / "connector.json").read_text())
        config["config"]["mongodb.connection.string"] = uri
        config["config"]["collection.include.list"] = "inventory\\.customers"
        (component / "connector.json").write_text(json.dumps(config, indent=2))
        (component / "defs.yaml").write_text(
            (component / "defs.yaml").read_text().replace("slice_granularity: hourly", "slice_granularity: 1min")
            .replace("spark_master: local[2]", "spark_master: local[1]"))
        _run([str(bin_ / "dg"), "check", "defs"], project, env)

        _run([str(bin_ / "dg"), "launch", "--assets", "inventory/customers/snapshot"], project, env)
        customers.insert_one({"_id": 100, "name": "late", "tier": 1})
        customers.update_one({"_id": 1}, {"$set": {"tier": 9}})
        customers.replace_one({"_id": 2}, {"name": "replaced"})
        customers.delete_one({"_id": 3})
        after = _cluster_time(client)
        # the window holding the last write must have closed on the server's clock before its slice runs
        last = datetime.fromtimestamp(after.time, UTC).replace(second=0)
        while _cluster_time(client).time < (last + timedelta(minutes=1)).timestamp() + 1:
            time.sleep(1)
        # windows start at the one holding the oplog's first entry (a fresh emulator's: its start)
        oplog_first = client.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])
        assert oplog_first is not None
        first = max(last - timedelta(minutes=3), datetime.fromtimestamp(oplog_first["ts"].time, UTC).replace(second=0))
        span = f"{first:%Y-%m-%d-%H:%M}...{last:%Y-%m-%d-%H:%M}"
        _run([str(bin_ / "dg"), "launch", "--assets", "inventory/customers/slices", "--partition-range", span],
             project, env)
        _run([str(bin_ / "dg"), "launch", "--assets",
              "inventory/customers/changelog,inventory/customers/current_state"], project, env)
        check = _run([str(bin_ / "mongocdc"), "check", "-m", "cdc_project.definitions",
                      "--collection", "inventory.customers"], project, env)
        assert "PASS  inventory/customers/current_state  matches_source" in check.stdout, check.stdout
        assert "FAIL" not in check.stdout
    finally:
        emulator.terminate()
        emulator.wait(60)
        shutil.rmtree(root / "mongo", ignore_errors=True)
