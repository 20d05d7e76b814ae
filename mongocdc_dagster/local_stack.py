"""The local development stack's defaults, in one place, and the `make dev` launcher.

With neither ``MONGOCDC_CONFIG`` nor ``MONGOCDC_HOME`` set, the Dagster definitions point at the stack
this module starts: the emulated replica set on 127.0.0.1:27117 (replica set ``rs0``), state and landing
zone under ``.local/`` in the repository, and the connector config shipped next to this file. ``make dev``
takes other ports and a home directory (``ARGS="--port 27200 --home /tmp/cdc"``), writes a connector
config for the emulator it started, and keeps a ``DAGSTER_HOME`` that is already set.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import yaml
from pymongo.errors import PyMongoError

from mongocdc_core.java import AOT_CACHE_JAVA, SPARK_JAVAS, installed_jdks, version_key
from mongocdc_core.logs import command_logging

REPO_ROOT = Path(__file__).resolve().parent.parent
EMULATOR_HOST = "127.0.0.1"
EMULATOR_PORT = 27117
REPLICA_SET = "rs0"
LOCAL_DIR = REPO_ROOT / ".local"
DEFAULT_HOME = LOCAL_DIR
DEFAULT_CONFIG = Path(__file__).resolve().parent / "local_connector.json"
DAGSTER_YAML = REPO_ROOT / "dagster.yaml"
WORKSPACE_YAML = REPO_ROOT / "workspace.yaml"
DEMO_DATABASE = "inventory"
DEMO_SIGNAL_COLLECTION = "debezium_signal"

log = logging.getLogger("mongocdc.dev")


def emulator_uri(port: int = EMULATOR_PORT) -> str:
    """The connection string of the local emulator."""
    return f"mongodb://{EMULATOR_HOST}:{port}/?replicaSet={REPLICA_SET}"


def newest_java_home(installed: Path = Path("/usr/lib/jvm")) -> str | None:
    """The newest JDK installed where Debian puts them that Spark runs on, when it is recent enough for an
    ahead-of-time cache (Java 25): the stack's Spark runs there unless ``JAVA_HOME`` is set, as each run's fresh
    driver then starts from the cache (:mod:`mongocdc_core.tables.aot`)."""
    usable = [(version_key(runtime), home) for home, runtime in installed_jdks(installed) if runtime.major in SPARK_JAVAS]
    newest = max(usable, default=None)
    return str(newest[1]) if newest is not None and newest[0][0] >= AOT_CACHE_JAVA else None


def wait_for_port(host: str, port: int, timeout: float, server: subprocess.Popen[bytes] | None = None) -> None:
    """Block until something accepts TCP connections on host:port (a started server), or fail; when the
    ``server`` process is given, stop waiting as soon as it has exited (``ServerExited``)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if server is not None and server.poll() is not None:
                raise ServerExited(server.returncode) from None
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing is listening on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.2)


class ServerExited(Exception):
    """The server being waited for exited (its exit code)."""

    def __init__(self, returncode: int) -> None:
        super().__init__(f"exited with code {returncode}")
        self.returncode = returncode


def seed_demo_data(uri: str) -> int:
    """Insert a small demo data set when the demo database is empty; returns the documents inserted."""
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(uri, serverSelectionTimeoutMS=10_000)
    try:
        db = client[DEMO_DATABASE]
        if any(name != DEMO_SIGNAL_COLLECTION for name in db.list_collection_names()):
            return 0
        customers = [
            {"_id": 1001 + i, "first_name": first, "last_name": last, "email": f"{first.lower()}@example.com"}
            for i, (first, last) in enumerate(
                [("Sally", "Thomas"), ("George", "Bailey"), ("Edward", "Walker"), ("Anne", "Kretchmar")]
            )
        ]
        products = [
            {"_id": 101 + i, "name": name, "description": desc, "weight": weight}
            for i, (name, desc, weight) in enumerate(
                [
                    ("scooter", "Small 2-wheel scooter", 3.14),
                    ("car battery", "12V car battery", 8.1),
                    ("hammer", "12oz carpenter's hammer", 0.75),
                    ("rocks", "box of assorted rocks", 5.3),
                ]
            )
        ]
        orders = [
            {"_id": 10001 + i, "purchaser_id": 1001 + i % 4, "product_id": 101 + i % 4, "quantity": 1 + i}
            for i in range(6)
        ]
        db.customers.insert_many(customers)
        db.products.insert_many(products)
        db.orders.insert_many(orders)
        db.create_collection(DEMO_SIGNAL_COLLECTION)
        return len(customers) + len(products) + len(orders)
    finally:
        client.close()


def write_local_config(path: Path, port: int) -> Path:
    """The shipped connector config, pointed at the emulator on ``port``."""
    config = orjson.loads(DEFAULT_CONFIG.read_bytes())
    config["config"]["mongodb.connection.string"] = emulator_uri(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(config, option=orjson.OPT_INDENT_2))
    return path


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m mongocdc_dagster.local_stack",
        description="Start the emulated replica set, seed demo data, and run `dagster dev` against it.",
    )
    parser.add_argument("--port", type=int, default=EMULATOR_PORT, help=f"emulator port (default {EMULATOR_PORT})")
    parser.add_argument("--dagster-port", type=int, default=3000, help="Dagster UI port (default 3000)")
    parser.add_argument("--home", type=Path, default=DEFAULT_HOME,
                        help="emulator data, landing zone and tables (default .local/; MONGOCDC_HOME wins when set)")
    parser.add_argument("--dagster-home", type=Path, default=None,
                        help="Dagster instance directory (default: DAGSTER_HOME when set, else <home>/dagster)")
    return parser.parse_args(argv)


def prepare_dagster_home(path: Path) -> Path:
    """An instance directory with the project's dagster.yaml (an existing one is kept, with what it lacks of
    the project's ``python_logs``: ``add_python_logs``) and the pool limits."""
    path.mkdir(parents=True, exist_ok=True)
    if not (path / "dagster.yaml").exists():
        shutil.copyfile(DAGSTER_YAML, path / "dagster.yaml")
    else:
        add_python_logs(path / "dagster.yaml")
    from dagster import DagsterInstance

    from mongocdc_dagster.pools import configure_pools

    with DagsterInstance.from_config(str(path)) as instance:
        configure_pools(instance)
    return path


def add_python_logs(path: Path) -> None:
    """Give an instance's dagster.yaml what it lacks of the project's ``python_logs`` block (mongocdc's loggers
    in ``managed_python_loggers``, a ``python_log_level``), so that the engine's records are the runs'; the
    operator's own settings stay as they are (their loggers and level too). A file without ``python_logs``
    gets the block appended (its text, comments included, unchanged); one with a partial block is rewritten."""
    text = path.read_text()
    try:
        current = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise SystemExit(f"make dev: {path} is not valid YAML: {exc}") from None
    if not isinstance(current, dict):
        raise SystemExit(f"make dev: {path}: expected a mapping (Dagster's instance settings), "
                         f"got {type(current).__name__}")
    have = current.get("python_logs") or {}
    if not isinstance(have, dict):
        raise SystemExit(f"make dev: {path}: python_logs: expected a mapping, got {type(have).__name__}")
    have = dict(have)
    wanted = yaml.safe_load(DAGSTER_YAML.read_text())["python_logs"]
    loggers = list(have.get("managed_python_loggers") or [])
    missing = [name for name in wanted["managed_python_loggers"] if name not in loggers]
    added = []
    if missing:
        have["managed_python_loggers"] = loggers + missing
        added.append(f"managed_python_loggers {', '.join(missing)}")
    if "python_log_level" not in have:
        have["python_log_level"] = wanted["python_log_level"]
        added.append(f"python_log_level {wanted['python_log_level']}")
    if not added:
        return
    if "python_logs" in current:
        text = yaml.safe_dump({**current, "python_logs": have}, sort_keys=False)
    else:
        text = text.rstrip("\n") + "\n\n" + yaml.safe_dump({"python_logs": have}, sort_keys=False)
    path.write_text(text)
    log.info(f"{path}: added python_logs {'; '.join(added)} (mongocdc's log records in each run's event log)")


class _Shutdown:
    """Stops `dagster dev` on SIGINT or SIGTERM alike, however ``make dev`` was started.

    Its handlers are installed before any child starts, so the children begin with SIGINT at its default
    even where this process began with it ignored (a non-interactive shell starts background commands so,
    and `dagster dev` maps SIGTERM to whatever SIGINT does). `dagster dev` runs in a session of its own, so
    a terminal's Ctrl-C reaches it once, through here: the first signal interrupts it (it stops its
    webserver, daemon and code servers), a second one kills its whole process group.
    """

    def __init__(self) -> None:
        self.requested = 0
        self.forwarded = 0
        self.dagster: subprocess.Popen[bytes] | None = None
        signal.signal(signal.SIGINT, self.handle)
        signal.signal(signal.SIGTERM, self.handle)

    def handle(self, signum: int, frame: object) -> None:
        self.requested += 1
        self.forward()

    def forward(self) -> None:
        """Pass on the signals received so far that `dagster dev` has not been given yet."""
        while self.dagster is not None and self.forwarded < self.requested:
            self.forwarded += 1
            if self.forwarded == 1:
                self.dagster.send_signal(signal.SIGINT)
            else:
                _signal_group(self.dagster.pid, signal.SIGKILL)


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to a process group; False when no process is left in it."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def stop_group(pgid: int, grace_s: float = 15.0) -> None:
    """End what is left in a process group whose leader exited (`dagster dev`'s code servers and run workers,
    a killed daemon's code server): SIGTERM, then SIGKILL for what is still there after ``grace_s``, and
    returns once they are gone (a signal is delivered when the process next runs: on a busy machine, later)."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _signal_group(pgid, 0):
            return
        time.sleep(0.2)
    _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 10.0  # SIGKILL cannot be caught; only an unreaped zombie outlasts this
    while _signal_group(pgid, 0) and time.monotonic() < deadline:
        time.sleep(0.05)


def _first_to_end(*children: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
    """The first of ``children`` to exit (checked every second: a launcher's supervision, not a test's)."""
    while True:
        for child in children:
            if child.poll() is not None:
                return child
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    """`make dev`: emulator in the background, demo data, then `dagster dev` in the foreground."""
    args = _parse_args(argv)
    # MONGOCDC_LOG_FORMAT=json: this launcher's lines and Dagster's services log one JSON object per line (the
    # variable also reaches the runs: see mongocdc_dagster.logs). From WARNING on: the instance's migrations
    # log at INFO, kept out of the launcher's output.
    fmt, _ = command_logging("make dev", None, "WARNING")
    log.setLevel(logging.INFO)
    shutdown = _Shutdown()
    home = Path(os.environ.get("MONGOCDC_HOME") or args.home).resolve()
    dagster_home = prepare_dagster_home(
        (args.dagster_home or Path(os.environ.get("DAGSTER_HOME") or home / "dagster")).resolve())
    # The emulator has its own session too; it is stopped after Dagster exits, letting sensors finish their
    # calls while Dagster shuts down. Its output goes to a log file, named when it ends unasked.
    home.mkdir(parents=True, exist_ok=True)
    emulator_log = home / "emulator.log"
    with open(emulator_log, "ab") as out:
        emulator = subprocess.Popen(
            [sys.executable, "-m", "mongocdc_devstack.server", "--port", str(args.port),
             "--replset", REPLICA_SET, "--dbpath", str(home / "mongo")],
            cwd=REPO_ROOT, start_new_session=True, stdout=out, stderr=subprocess.STDOUT,
        )
    died = (f"the emulated MongoDB on {emulator_uri(args.port)} exited with code {{code}} {{when}} "
            f"(its log: {emulator_log}): stopping make dev")
    dagster: subprocess.Popen[bytes] | None = None
    try:
        try:
            wait_for_port(EMULATOR_HOST, args.port, timeout=60, server=emulator)
            seeded = seed_demo_data(emulator_uri(args.port))
        except (ServerExited, PyMongoError, TimeoutError) as exc:
            try:  # a dropped connection can come just before the process has ended
                code = emulator.wait(timeout=5)
            except subprocess.TimeoutExpired:  # it runs, but did not answer or refused the seeding
                log.error(f"the emulated MongoDB on {emulator_uri(args.port)} runs, but seeding it failed: "
                          f"{type(exc).__name__}: {exc} (its log: {emulator_log}): stopping make dev")
                return 1
            log.error(died.format(code=code, when="before `dagster dev` started"))
            return 1
        log.info(f"emulator on {emulator_uri(args.port)} (log {emulator_log}); seeded {seeded} demo documents; "
                 f"home {home}; DAGSTER_HOME {dagster_home}")
        if shutdown.requested:
            return 0
        env = dict(os.environ, DAGSTER_HOME=str(dagster_home), MONGOCDC_HOME=str(home))
        if "JAVA_HOME" not in env and (java_home := newest_java_home()) is not None:
            env["JAVA_HOME"] = java_home
            log.info(f"Spark runs on {java_home} (the newest Java here; set JAVA_HOME for another)")
        if "MONGOCDC_CONFIG" not in env:
            env["MONGOCDC_CONFIG"] = str(write_local_config(home / "connector.json", args.port))
        dagster = subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster"), "dev", "-h", "127.0.0.1",
             "-p", str(args.dagster_port), "-w", str(WORKSPACE_YAML), *(["--log-format", "json"] if fmt == "json" else [])],
            cwd=REPO_ROOT, env=env, start_new_session=True,
        )
        shutdown.dagster = dagster
        shutdown.forward()  # a signal that came while it was starting
        ended = _first_to_end(dagster, emulator)
        if shutdown.requested:
            dagster.wait()
            return 0  # `dagster dev` ends an interrupt with click's "Aborted!" (1)
        if ended is emulator:
            log.error(died.format(code=emulator.returncode, when="while `dagster dev` ran"))
        else:  # its daemon or webserver ended (a daemon killed, say): `dagster dev` stops itself, code 0
            log.error(f"`dagster dev` ended with code {dagster.returncode} without being asked to (its output is "
                      "above): stopping make dev")
        return 1
    finally:
        if dagster is not None:
            if dagster.poll() is None:  # left running by an error here: stopped as a signal stops it
                dagster.send_signal(signal.SIGINT)
                dagster.wait()
            stop_group(dagster.pid)
        emulator.terminate()
        try:
            emulator.wait(timeout=15)
        except subprocess.TimeoutExpired:
            emulator.kill()


if __name__ == "__main__":
    sys.exit(main())
