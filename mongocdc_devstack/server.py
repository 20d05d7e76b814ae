"""``mongocdc emulator``: the emulated MongoDB from the command line, a replica set or a sharded cluster.

A development and test stand-in for mongod (no MongoDB server can be installed on the project's
machines): :mod:`mongocdc_devstack.mongod` is one replica set, :mod:`mongocdc_devstack.sharding` a
mongos in front of several. This module sits above both and only parses arguments and runs one.

Run it with ``mongocdc emulator --port 27017 --replset rs0`` or
``python -m mongocdc_devstack.server --port 27017`` (add ``--shards N`` for a sharded cluster).
"""

from __future__ import annotations

import argparse
import os
import signal
import ssl
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from bson import json_util

from .mongod import EmulatorServer, ServerConfig
from .sharding import ClusterConfig, ShardedCluster


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mongocdc emulator",
        description="Run the emulated MongoDB 7.0 single-member replica set, or a sharded cluster with --shards "
                    "(development/test stand-in).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=27017, help="TCP port (0 picks a free one)")
    parser.add_argument("--replset", default="rs0", help="replica set name (default rs0)")
    parser.add_argument("--oplog-size-mb", type=float, default=192.0, help="oplog cap in MiB (default 192)")
    parser.add_argument("--noop-interval", type=float, default=10.0, help="seconds between periodic no-op oplog entries (0: never)")
    parser.add_argument("--dbpath", default=None, help="directory for data files; in memory when omitted")
    add_security_arguments(parser)
    parser.add_argument("--shards", type=int, default=0,
                        help="run a sharded cluster instead: a mongos on --port and this many shards (replica sets "
                             "shard0, shard1, ...) on the next ports")  # fmt: skip
    parser.add_argument("--layout", default=None,
                        help="with --shards: JSON file of database primaries, placed and sharded collections (chunks)")
    return parser


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """``--auth``, ``--users-file`` and ``--tls-certificate-key-file`` (shared with ``--sharded``)."""
    parser.add_argument("--auth", action="store_true",
                        help="access control: refuse commands without an authenticated, authorized user")
    parser.add_argument("--users-file", default=None,
                        help="JSON file of users and roles to create at start: "
                             '{"users": [{"user", "pwd", "db", "roles"}], "roles": [...]}')
    parser.add_argument("--tls-certificate-key-file", default=None,
                        help="PEM file with the server certificate and its key: accept TLS connections only")


def security_problem(args: argparse.Namespace) -> str | None:
    """One line naming what is wrong with the security options (None: fine)."""
    for option, path in (("--users-file", args.users_file), ("--tls-certificate-key-file", args.tls_certificate_key_file)):
        if path is not None and not os.path.isfile(path):
            return f"{option} {path}: no such file"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """``mongocdc emulator ...``: run in the foreground until SIGTERM/SIGINT."""
    args = build_parser().parse_args(argv)
    if args.oplog_size_mb <= 0:
        print(f"--oplog-size-mb must be positive, got {args.oplog_size_mb}", file=sys.stderr)
        return 2
    if args.port < 0 or args.port > 65535:
        print(f"--port must be between 0 and 65535, got {args.port}", file=sys.stderr)
        return 2
    if args.shards < 0:
        print(f"--shards must be positive, got {args.shards}", file=sys.stderr)
        return 2
    if args.layout and not args.shards:
        print("--layout needs --shards (it describes a sharded cluster)", file=sys.stderr)
        return 2
    if args.shards:
        return run_cluster(args)
    problem = security_problem(args)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    config = ServerConfig(args.host, args.port, args.replset, args.oplog_size_mb, args.noop_interval, args.dbpath,
                          args.auth, args.users_file, args.tls_certificate_key_file)  # fmt: skip
    try:
        server = EmulatorServer(config)
    except ssl.SSLError as exc:
        print(f"--tls-certificate-key-file {args.tls_certificate_key_file}: not a PEM certificate and key ({exc})", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"cannot listen on {args.host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    extras = "".join(f", {flag}" for flag, on in (("TLS", config.tls_certificate_key_file), ("auth", config.auth)) if on)
    print(f"mongocdc emulator listening on {config.host}:{config.port} (replica set {config.replset}{extras})", flush=True)
    while not stop.wait(0.5):
        pass
    server.shutdown()
    sys.stdout.flush()
    return 0


def run_cluster(args: argparse.Namespace) -> int:
    """``mongocdc emulator --shards N ...``: a mongos on ``--port``, shards on the next ports, until SIGTERM."""
    problem = security_problem(args)
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    layout: Mapping[str, Any] | None = None
    if args.layout:
        try:
            with open(args.layout, encoding="utf-8") as handle:
                layout = json_util.loads(handle.read())
        except (OSError, ValueError) as exc:
            print(f"--layout {args.layout}: {exc}", file=sys.stderr)
            return 2
    shard_ports = [args.port + 1 + i if args.port else 0 for i in range(args.shards)]
    config = ClusterConfig(args.host, args.port, args.shards, shard_ports, layout, args.oplog_size_mb, args.noop_interval,
                           args.dbpath, args.auth, args.users_file, args.tls_certificate_key_file)  # fmt: skip
    try:
        cluster = ShardedCluster(config)
    except ValueError as exc:
        print(f"--layout {args.layout}: {exc}" if args.layout and "users file" not in str(exc) else str(exc), file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"cannot listen on {args.host}: {exc.strerror}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster.start()
    shards = ", ".join(f"{name} on {server.config.address}" for name, server in cluster.shards.items())
    print(f"mongocdc emulator listening on {config.host}:{cluster.port} (mongos; {shards})", flush=True)
    while not stop.wait(0.5):
        pass
    cluster.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
