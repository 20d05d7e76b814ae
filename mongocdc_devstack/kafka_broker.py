"""A real single-node Apache Kafka broker (KRaft) for development, demos and tests.

The jars are the ones ``kafka/pom.xml`` lists (:data:`KAFKA_JARS`), found as :mod:`mongocdc_core.maven`
finds every set: in ``--jars-dir`` or ``$MONGOCDC_KAFKA_JARS``, a checkout's ``.jars/kafka`` (``make setup``),
or the user cache that ``mongocdc kafka jars`` fills from Maven Central. This module runs them: it formats
KRaft storage once per data directory, starts ``kafka.Kafka`` in a JVM subprocess on loopback ports with
exactly those jars on its class path, waits until the broker answers metadata requests, and stops it with
SIGTERM (then SIGKILL). Nothing is downloaded when a broker starts.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import errno
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from mongocdc_core.java import java_executable
from mongocdc_core.logs import add_log_format_option, command_logging
from mongocdc_core.maven import JarsError, JarSet, add_download_arguments, download_command

__all__ = [
    "JARS_ENV",
    "KAFKA_JARS",
    "KafkaBroker",
    "KafkaBrokerError",
    "find_jars",
    "find_java",
    "main",
]

JARS_ENV = "MONGOCDC_KAFKA_JARS"
"""Environment variable naming a directory that holds the Kafka jars."""
KAFKA_JARS = JarSet(name="kafka", what="the Kafka broker's jars", pom=Path(__file__).with_name("kafka") / "pom.xml",
                    env=JARS_ENV, command="mongocdc kafka jars")

NODE_ID = 1
LOOPBACK = "127.0.0.1"
LOG_FILE_NAME = "kafka.log"
_KAFKA_MAIN = "kafka.Kafka"
_STORAGE_TOOL_MAIN = "kafka.tools.StorageTool"
_LOG_TAIL_LINES = 40

_log = logging.getLogger(__name__)
_cli_log = logging.getLogger("mongocdc.kafka")

# Broker settings for a throwaway single node: every internal topic has one replica and one partition so
# the first transactional producer or consumer group does not wait for 50 partitions to be created.
_BASE_PROPERTIES: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": str(NODE_ID),
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "true",
    "log.segment.bytes": str(16 * 1024 * 1024),
    # Development data lives as long as its directory; events often carry old source timestamps.
    "log.retention.ms": "-1",
    "log.cleaner.backoff.ms": "1000",
    "num.network.threads": "2",
    "num.io.threads": "4",
}

_LOG4J2_PROPERTIES = """\
# Warnings and errors, plus the few INFO lines that show how far start-up and shutdown got.
status = warn
shutdownHook = disable
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stdout.ref = STDOUT
logger.raftserver.name = kafka.server.KafkaRaftServer
logger.raftserver.level = INFO
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = INFO
logger.controller.name = kafka.server.ControllerServer
logger.controller.level = INFO
logger.lifecycle.name = org.apache.kafka.server.BrokerLifecycleManager
logger.lifecycle.level = INFO
logger.kafka.name = kafka.Kafka$
logger.kafka.level = INFO
"""


class KafkaBrokerError(RuntimeError):
    """The local broker could not be set up, started or stopped; the message says what to do."""


def find_jars(named: Path | None = None) -> Path:
    """The directory holding every jar of ``kafka/pom.xml`` (see the module docstring for where it is looked
    for); KafkaBrokerError naming the ways to get them when none does (clearer than a ClassNotFound)."""
    try:
        return KAFKA_JARS.require(named)
    except JarsError as exc:
        raise KafkaBrokerError(f"cannot start the Kafka broker: {exc}") from exc


def find_java() -> str:
    """The ``java`` executable: ``$JAVA_HOME/bin/java`` when that exists, else ``java`` on PATH."""
    found = java_executable()
    if found is None:
        raise KafkaBrokerError(
            "cannot start the Kafka broker: no `java` executable on PATH (and JAVA_HOME is not set to a JDK); "
            "install Java 17 or newer"
        )
    return found


#: Starts on freshly chosen ports when one was taken between choosing it and the JVM binding it.
_PORT_ATTEMPTS = 3


def _free_ports(count: int) -> list[int]:
    """Distinct free loopback ports; all sockets are held open together so no port is returned twice."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _check_port_free(port: int, role: str) -> None:
    """Refuse a taken port up front; the JVM would otherwise die with a BindException deep in its log."""
    if not 0 < port < 65536:
        raise KafkaBrokerError(f"{role} port must be between 1 and 65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise KafkaBrokerError(
                    f"{role} port {port} on {LOOPBACK} is already in use; stop whatever listens there "
                    "or choose another port"
                ) from exc
            raise KafkaBrokerError(f"cannot use {role} port {port} on {LOOPBACK}: {exc}") from exc


def _new_cluster_id() -> str:
    """A random KRaft cluster id in Kafka's Uuid text form (22 chars of URL-safe base64, no padding)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):  # Kafka avoids ids that look like command-line options
            return text


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    """Last lines of a log file for error messages, or a note that there is none."""
    try:
        content = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return f"(no log file at {path})"
    return "\n".join(content[-lines:]) if content else f"({path} is empty)"


def _render_properties(properties: Mapping[str, str]) -> str:
    """server.properties text; values are escaped the way java.util.Properties reads them."""
    lines = ["# Generated by mongocdc_devstack.kafka_broker; rewritten on every start."]
    for key, value in properties.items():
        escaped = value.replace("\\", "\\\\").replace("\n", "\\n")
        lines.append(f"{key}={escaped}")
    return "\n".join(lines) + "\n"


class KafkaBroker:
    """One KRaft broker+controller process on loopback, with its data in ``data_dir``.

    ``port`` None picks a free port at the first start; the ports stay the same across ``stop()`` and
    ``start()`` so clients can reconnect to the same bootstrap address after a restart. Extra broker
    settings go in ``properties`` and override the single-node defaults.
    """

    def __init__(
        self,
        port: int | None,
        data_dir: Path,
        jars_dir: Path | None = None,
        *,
        properties: Mapping[str, str] | None = None,
        heap: str = "512m",
        startup_timeout: float = 90.0,
        shutdown_timeout: float = 30.0,
    ) -> None:
        self._requested_port = port
        self._port: int | None = port
        self._controller_port: int | None = None
        self.data_dir = Path(data_dir).expanduser().resolve()
        self._named_jars = Path(jars_dir).expanduser().resolve() if jars_dir is not None else None
        self.jars_dir: Path | None = self._named_jars
        """The jars' directory: the one named, else the one :func:`find_jars` finds at ``start()``."""
        self._overrides = dict(properties or {})
        self._heap = heap
        self._startup_timeout = startup_timeout
        self._shutdown_timeout = shutdown_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._lock_fd: int | None = None

    # -- paths and addresses -------------------------------------------------------------------------

    @property
    def log_path(self) -> Path:
        """The broker's combined stdout/stderr and log4j output."""
        return self.data_dir / LOG_FILE_NAME

    @property
    def log_dirs(self) -> Path:
        """Kafka's ``log.dirs`` (topic partitions and the KRaft metadata log)."""
        return self.data_dir / "kraft-logs"

    @property
    def port(self) -> int:
        """The PLAINTEXT client port; known once the broker has been started."""
        if self._port is None:
            raise KafkaBrokerError("the broker port is chosen at start(); start the broker first")
        return self._port

    @property
    def controller_port(self) -> int:
        """The KRaft controller quorum port; known once the broker has been started."""
        if self._controller_port is None:
            raise KafkaBrokerError("the controller port is chosen at start(); start the broker first")
        return self._controller_port

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for the ``bootstrap.servers`` client setting."""
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The JVM's process id while it runs."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def is_running(self) -> bool:
        """Whether the JVM is alive (it may still be starting or already shutting down)."""
        return self._process is not None and self._process.poll() is None

    # -- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> KafkaBroker:
        """Format storage if needed, launch the JVM and block until the broker serves metadata."""
        if self.is_running:
            raise KafkaBrokerError(f"the Kafka broker on {self.bootstrap_servers} is already running")
        self._terminate()  # reap a JVM that died on its own and release its data dir lock
        java = find_java()
        self.jars_dir = find_jars(self._named_jars)
        jvm = self._java_command(java, self.jars_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Ports picked here are free when checked, but the JVM binds them a few seconds later: another
        # process may take one meanwhile. Then the broker starts again on other ports (only on a first
        # start with ports of its own choosing; a restart keeps the ports its clients know).
        attempts = _PORT_ATTEMPTS if self._requested_port is None and self._port is None else 1
        for attempt in range(1, attempts + 1):
            self._lock_data_dir()
            try:
                self._choose_ports()
                config_path = self._write_config()
                if not (self.log_dirs / "meta.properties").exists():
                    self._format_storage(jvm, config_path)
                started = time.monotonic()
                self._launch(jvm, config_path)
                self._wait_until_ready(started)
            except KafkaBrokerError as exc:
                self.stop()
                if attempt == attempts or "already in use" not in str(exc):
                    raise
                _log.warning("Kafka broker port %s or %s was taken before the broker bound it; trying other ports",
                             self._port, self._controller_port)  # fmt: skip
                self._port = self._controller_port = None
                continue
            except BaseException:
                self.stop()
                raise
            break
        _log.info(
            "Kafka broker ready on %s after %.1fs (pid %s)",
            self.bootstrap_servers,
            time.monotonic() - started,
            self.pid,
        )
        return self

    def stop(self) -> None:
        """SIGTERM for a clean shutdown (flushes logs, so a restart needs no recovery); SIGKILL after the
        timeout. Safe to call when the broker is not running."""
        atexit.unregister(self._stop_at_exit)
        self._terminate()

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = self.bootstrap_servers if self._port is not None else "port not chosen"
        state = "running" if self.is_running else "stopped"
        return f"KafkaBroker({where}, data_dir={str(self.data_dir)!r}, {state})"

    # -- internals -----------------------------------------------------------------------------------

    def _choose_ports(self) -> None:
        """Keep the ports of an earlier start; otherwise check the requested one and pick the rest."""
        if self._port is None or self._controller_port is None:
            if self._requested_port is None:
                self._port, self._controller_port = _free_ports(2)
            else:
                self._port = self._requested_port
                self._controller_port = next(p for p in _free_ports(2) if p != self._requested_port)
        _check_port_free(self.port, "Kafka broker")
        _check_port_free(self.controller_port, "Kafka controller")

    def _write_config(self) -> Path:
        properties = {
            **_BASE_PROPERTIES,
            "controller.quorum.voters": f"{NODE_ID}@{LOOPBACK}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self.port},CONTROLLER://{LOOPBACK}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self.port}",
            "log.dirs": str(self.log_dirs),
            **self._overrides,
        }
        config_path = self.data_dir / "server.properties"
        config_path.write_text(_render_properties(properties), encoding="utf-8")
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2_PROPERTIES, encoding="utf-8")
        return config_path

    def _lock_data_dir(self) -> None:
        """Hold an exclusive lock on the data dir for the broker's lifetime.

        Kafka locks its log dirs only after the controller has already written to the metadata log, so a
        second broker on a directory in use would damage the running one. The lock's file descriptor is
        inherited by the JVM, so an orphaned broker keeps the directory locked after Python is gone.
        """
        lock_path = self.data_dir / ".broker.lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", errors="replace").strip() or "unknown"
            os.close(fd)
            raise KafkaBrokerError(
                f"data directory {self.data_dir} is in use by another Kafka broker (JVM pid {holder}, see "
                f"{lock_path}); stop that broker or choose another directory"
            ) from None
        self._lock_fd = fd

    def _launch(self, jvm: list[str], config_path: Path) -> None:
        assert self._lock_fd is not None
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== mongocdc: starting Kafka broker on {self.bootstrap_servers} ===\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                [*jvm, _KAFKA_MAIN, str(config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                pass_fds=(self._lock_fd,),
                start_new_session=True,  # a terminal Ctrl-C goes to us; we stop the JVM ourselves
            )
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{self._process.pid}\n".encode("ascii"), 0)
        atexit.register(self._stop_at_exit)

    def _java_command(self, java: str, jars_dir: Path) -> list[str]:
        """The JVM and its options, with exactly the pom's jars on the class path."""
        return [
            java,
            f"-Xmx{self._heap}",
            "-Xms128m",
            # A dev broker on a small machine: the client JIT and serial GC start fastest and use the
            # fewest threads, at some cost in peak throughput that tests and demos do not need.
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-Xss1m",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.data_dir}",
            "-cp",
            os.pathsep.join(str(p) for p in KAFKA_JARS.paths(jars_dir)),
        ]

    def _format_storage(self, jvm: list[str], config_path: Path) -> None:
        """``kafka-storage format`` equivalent: writes meta.properties and the bootstrap metadata."""
        command = [
            *jvm,
            _STORAGE_TOOL_MAIN,
            "format",
            "--config",
            str(config_path),
            "--cluster-id",
            _new_cluster_id(),
            "--ignore-formatted",
        ]
        try:
            result = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                cwd=self.data_dir,
                timeout=self._startup_timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise KafkaBrokerError(
                f"formatting Kafka storage in {self.log_dirs} did not finish within {self._startup_timeout:.0f}s"
            ) from exc
        output = (result.stdout + result.stderr).decode("utf-8", errors="replace")
        with open(self.log_path, "a", encoding="utf-8") as log:
            log.write(f"=== mongocdc: kafka-storage format (exit {result.returncode}) ===\n{output}\n")
        if result.returncode != 0:
            tail = "\n".join(output.strip().splitlines()[-_LOG_TAIL_LINES:])
            raise KafkaBrokerError(
                f"formatting Kafka storage in {self.log_dirs} failed (exit {result.returncode}):\n{tail}"
            )

    def _wait_until_ready(self, started: float) -> None:
        """Wait for the TCP listener, then for a metadata answer that lists this broker."""
        deadline = started + self._startup_timeout
        self._wait_for_listener(deadline)
        admin = AdminClient(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 250,
            },
            logger=logging.getLogger(f"{__name__}.librdkafka"),  # connection-refused chatter stays quiet
        )
        while True:
            self._raise_if_exited()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                metadata = admin.list_topics(timeout=min(2.0, remaining))
            except KafkaException:
                continue
            if NODE_ID in metadata.brokers:
                return
            time.sleep(0.05)
        raise KafkaBrokerError(
            f"the Kafka broker did not become ready on {self.bootstrap_servers} within "
            f"{self._startup_timeout:.0f}s; last lines of {self.log_path}:\n{_tail(self.log_path)}"
        )

    def _wait_for_listener(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            self._raise_if_exited()
            try:
                with socket.create_connection((LOOPBACK, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)

    def _raise_if_exited(self) -> None:
        if self._process is not None and (code := self._process.poll()) is not None:
            raise KafkaBrokerError(
                f"the Kafka broker exited during start-up with code {code}; last lines of "
                f"{self.log_path}:\n{_tail(self.log_path)}"
            )

    def _terminate(self) -> None:
        process, self._process = self._process, None
        try:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=self._shutdown_timeout)
                except subprocess.TimeoutExpired:
                    _log.warning(
                        "Kafka broker pid %s ignored SIGTERM for %.0fs; killing it",
                        process.pid,
                        self._shutdown_timeout,
                    )
                    process.kill()
                    process.wait()
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _stop_at_exit(self) -> None:
        """Do not leave an orphaned JVM holding the ports when the Python process exits."""
        self._terminate()


def _jars_main(argv: list[str]) -> int:
    """``mongocdc kafka jars``: download the broker's jars from Maven Central (see :data:`KAFKA_JARS`)."""
    parser = argparse.ArgumentParser(
        prog="mongocdc kafka jars",
        description="Download the local Kafka broker's jars (kafka/pom.xml) from Maven Central into the user "
                    f"cache, where `mongocdc kafka` looks for them, or into --dir (then set {JARS_ENV}).")
    add_download_arguments(parser, KAFKA_JARS)
    add_log_format_option(parser)
    args = parser.parse_args(argv)
    command_logging("mongocdc kafka jars", args.log_format, "INFO")
    return download_command(KAFKA_JARS, args.dir, args.repository, _cli_log)


def main(argv: Sequence[str] | None = None) -> int:
    """``mongocdc kafka``: run a broker in the foreground until SIGTERM or SIGINT, then stop it cleanly;
    ``mongocdc kafka jars`` downloads its jars."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["jars"]:
        return _jars_main(args_list[1:])
    parser = argparse.ArgumentParser(
        prog="mongocdc kafka",
        description="Run a local single-node Apache Kafka broker (KRaft) for development and tests.",
        epilog="`mongocdc kafka jars` downloads the broker's jars from Maven Central (see its --help).",
    )
    parser.add_argument(
        "--port", type=int, default=9092, help="client (PLAINTEXT) port on 127.0.0.1 (default 9092)"
    )
    parser.add_argument("--data-dir", type=Path, required=True, help="broker data; reused across restarts")
    parser.add_argument(
        "--jars-dir", type=Path, default=None,
        help=f"Kafka jars (default: ${JARS_ENV}, a checkout's .jars/kafka, then {KAFKA_JARS.user_cache()})",
    )
    parser.add_argument("--heap", default="512m", help="JVM maximum heap, as for -Xmx (default 512m)")
    add_log_format_option(parser)
    args = parser.parse_args(args_list)
    command_logging("mongocdc kafka", args.log_format, "INFO")

    stop_requested = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        stop_requested.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    broker = KafkaBroker(args.port, args.data_dir, args.jars_dir, heap=args.heap)
    try:
        try:
            broker.start()
        except KafkaBrokerError as exc:
            _cli_log.error(f"mongocdc kafka: {exc}")
            return 1
        # Plain stdout line so scripts (and tests) can wait for it.
        print(f"Kafka broker ready at {broker.bootstrap_servers} (pid {broker.pid})", flush=True)
        _cli_log.info(f"data in {broker.data_dir}, log in {broker.log_path}; Ctrl-C or SIGTERM stops it")
        while not stop_requested.wait(0.5):
            if not broker.is_running:
                _cli_log.error(f"mongocdc kafka: the Kafka broker exited unexpectedly; last lines of "
                               f"{broker.log_path}:\n{_tail(broker.log_path)}")
                return 1
        _cli_log.info("stopping the Kafka broker")
        broker.stop()
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
