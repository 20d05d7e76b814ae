"""Start and stop an emulated replica set (or sharded cluster) from tests, demos and benchmarks.

``EmulatedReplicaSet`` runs the emulator either in this process (background threads, fastest)
or as a separate ``python -m mongocdc_devstack.server`` process, which cross-process tests
and crash tests (``kill()`` sends SIGKILL) need. ``start()`` after ``stop()``/``kill()`` reuses
the same port and dbpath, so a restarted server looks like the same mongod to clients.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from .mongod import EmulatorServer, ServerConfig
from .sharding import ClusterConfig, ShardedCluster

STARTUP_TIMEOUT_SECONDS = 30.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive TCP ports that are all free right now.

    A cluster in its own process puts its shards on the ports after its mongos; a free first port alone
    lets a shard collide with a port another process holds.
    """
    for _ in range(100):
        base = free_port(host)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sockets.append(sock)
                sock.bind((host, port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports found on {host}")


def security_arguments(auth: bool, users_file: str | None, tls_certificate_key_file: str | None) -> list[str]:
    """The command-line flags of ``--auth``, ``--users-file`` and ``--tls-certificate-key-file``."""
    args = ["--auth"] if auth else []
    if users_file:
        args += ["--users-file", users_file]
    if tls_certificate_key_file:
        args += ["--tls-certificate-key-file", tls_certificate_key_file]
    return args


class EmulatedReplicaSet:
    """A running emulator with a ``uri`` for pymongo; usable as a context manager."""

    def __init__(
        self,
        port: int | None = None,
        replset: str = "rs0",
        oplog_size_mb: float = 64.0,
        noop_interval: float = 10.0,
        dbpath: str | None = None,
        in_process: bool = True,
        host: str = "127.0.0.1",
        auth: bool = False,
        users_file: str | None = None,
        tls_certificate_key_file: str | None = None,
    ) -> None:
        self.host = host
        self.auth = auth
        self.users_file = users_file
        self.tls_certificate_key_file = tls_certificate_key_file
        self.port = port or free_port(host)
        self.replset = replset
        self.oplog_size_mb = oplog_size_mb
        self.noop_interval = noop_interval
        self.dbpath = dbpath
        self.in_process = in_process
        self.server: EmulatorServer | None = None
        self.process: subprocess.Popen[str] | None = None

    @property
    def uri(self) -> str:
        return f"mongodb://{self.host}:{self.port}/?replicaSet={self.replset}"

    @property
    def running(self) -> bool:
        if self.server is not None:
            return True
        return self.process is not None and self.process.poll() is None

    def start(self) -> EmulatedReplicaSet:
        if self.running:
            raise RuntimeError(f"the emulator on port {self.port} is already running")
        if self.in_process:
            config = ServerConfig(self.host, self.port, self.replset, self.oplog_size_mb, self.noop_interval, self.dbpath,
                                  self.auth, self.users_file, self.tls_certificate_key_file)  # fmt: skip
            deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
            while True:
                try:
                    self.server = EmulatorServer(config)
                    break
                except OSError:  # the previous instance's socket may linger briefly
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            self.server.start()
        else:
            self._start_process()
        return self

    def _start_process(self) -> None:
        command = [
            sys.executable, "-m", "mongocdc_devstack.server", "--host", self.host, "--port", str(self.port),
            "--replset", self.replset, "--oplog-size-mb", str(self.oplog_size_mb),
            "--noop-interval", str(self.noop_interval),
        ]  # fmt: skip
        if self.dbpath:
            command += ["--dbpath", self.dbpath]
        command += security_arguments(self.auth, self.users_file, self.tls_certificate_key_file)
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            line = self._read_ready_line(process, deadline)
            if line is not None:
                self.process = process
                return
            stderr = process.stderr.read() if process.stderr else ""
            if "cannot listen" not in stderr or time.monotonic() > deadline:
                raise RuntimeError(f"the emulator did not start on port {self.port}: {stderr.strip() or 'no output'}")
            time.sleep(0.2)

    @staticmethod
    def _read_ready_line(process: subprocess.Popen[str], deadline: float) -> str | None:
        assert process.stdout is not None
        selector = selectors.DefaultSelector()
        selector.register(process.stdout, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if selector.select(timeout=0.2):
                    line = process.stdout.readline()
                    if "listening on" in line:
                        return line
                    if not line:
                        process.wait(timeout=5)
                        return None
                elif process.poll() is not None:
                    return None
            process.kill()
            process.wait()
            return None
        finally:
            selector.close()

    def stop(self) -> None:
        """Clean shutdown (SIGTERM for a subprocess); data is checkpointed with a dbpath."""
        if self.server is not None:
            self.server.faults.cancel()
            self.server.shutdown()
            self.server = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            self._close_pipes()
            self.process = None

    def kill(self) -> None:
        """SIGKILL the subprocess (a crash: no checkpoint, only the journal survives)."""
        if self.process is None:
            raise RuntimeError("kill() needs an emulator started with in_process=False")
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._close_pipes()
        self.process = None

    def _close_pipes(self) -> None:
        assert self.process is not None
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()

    def __enter__(self) -> EmulatedReplicaSet:
        if not self.running:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class EmulatedShardedCluster:
    """A running emulated sharded cluster (a mongos and ``shards`` shards) with a ``uri`` for pymongo.

    In this process by default (``cluster`` gives the shards for fault injection, e.g. ``step_down``),
    or as a ``python -m mongocdc_devstack.server --shards N`` process. ``layout`` places databases,
    collections and chunks (see ``mongocdc_devstack.layout``); ``shard_uri(name)`` reaches one shard's
    replica set directly, as a real shard can be reached.
    """

    def __init__(
        self,
        shards: int = 2,
        layout: Mapping[str, Any] | None = None,
        port: int | None = None,
        noop_interval: float = 0.5,
        oplog_size_mb: float = 64.0,
        dbpath: str | None = None,
        in_process: bool = True,
        host: str = "127.0.0.1",
        auth: bool = False,
        users_file: str | None = None,
        tls_certificate_key_file: str | None = None,
    ) -> None:
        self.host = host
        self.port = port or (free_port(host) if in_process else free_ports(shards + 1, host))
        self.shards = shards
        self.layout = layout
        self.noop_interval = noop_interval
        self.oplog_size_mb = oplog_size_mb
        self.dbpath = dbpath
        self.in_process = in_process
        self.auth = auth
        self.users_file = users_file
        self.tls_certificate_key_file = tls_certificate_key_file
        self.shard_ports = [free_port(host) for _ in range(shards)]
        self.cluster: ShardedCluster | None = None
        self.process: subprocess.Popen[str] | None = None

    @property
    def uri(self) -> str:
        """The mongos (no ``replicaSet``: drivers see a sharded topology)."""
        return f"mongodb://{self.host}:{self.port}/"

    def shard_uri(self, name: str) -> str:
        index = int(name.removeprefix("shard"))
        return f"mongodb://{self.host}:{self.shard_ports[index]}/?replicaSet={name}"

    def shard(self, name: str) -> EmulatorServer:
        """An in-process shard's server (fault injection: ``shard(name).faults.step_down(seconds)``)."""
        if self.cluster is None:
            raise RuntimeError("shard() needs an in-process cluster that is running")
        return self.cluster.shards[name]

    def start(self) -> EmulatedShardedCluster:
        if self.cluster is not None or (self.process is not None and self.process.poll() is None):
            raise RuntimeError(f"the sharded cluster on port {self.port} is already running")
        if self.in_process:
            config = ClusterConfig(self.host, self.port, self.shards, self.shard_ports, self.layout, self.oplog_size_mb,
                                   self.noop_interval, self.dbpath, self.auth, self.users_file,
                                   self.tls_certificate_key_file)  # fmt: skip
            deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
            while True:
                try:
                    self.cluster = ShardedCluster(config).start()
                    return self
                except OSError:  # the previous instance's sockets may linger briefly
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        if self.layout is not None:
            raise RuntimeError("a layout for a cluster in its own process goes through --layout; use dbpath or in_process")
        command = [
            sys.executable, "-m", "mongocdc_devstack.server", "--host", self.host, "--port", str(self.port),
            "--shards", str(self.shards), "--oplog-size-mb", str(self.oplog_size_mb), "--noop-interval", str(self.noop_interval),
        ]  # fmt: skip
        if self.dbpath:
            command += ["--dbpath", self.dbpath]
        command += security_arguments(self.auth, self.users_file, self.tls_certificate_key_file)
        self.shard_ports = [self.port + 1 + i for i in range(self.shards)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if EmulatedReplicaSet._read_ready_line(process, time.monotonic() + STARTUP_TIMEOUT_SECONDS) is None:
            stderr = process.stderr.read() if process.stderr else ""
            raise RuntimeError(f"the sharded cluster did not start on port {self.port}: {stderr.strip() or 'no output'}")
        self.process = process
        return self

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.shutdown()
            self.cluster = None
        if self.process is not None:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            for pipe in (self.process.stdout, self.process.stderr):
                if pipe is not None:
                    pipe.close()
            self.process = None

    def __enter__(self) -> EmulatedShardedCluster:
        if self.cluster is None and self.process is None:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
