"""Handshake, topology, diagnostics and session commands (hello, buildInfo, serverStatus, ...)."""

from __future__ import annotations

import datetime
import os
import platform
import socket
import time
from typing import Any

from bson import Int64, Timestamp

from ..errors import BAD_VALUE, TYPE_MISMATCH, command_error
from ..state import now_ms
from ..wire import MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE
from . import Context, command

VERSION = "7.0.14"
VERSION_ARRAY = [7, 0, 14, 0]
MAX_WIRE_VERSION = 21
MAX_WRITE_BATCH_SIZE = 100_000


def _optime(ts: Timestamp | None, term: int) -> dict[str, Any]:
    return {"ts": ts or Timestamp(0, 0), "t": Int64(term)}


@command("hello", "isMaster", "ismaster")
def hello(ctx: Context) -> dict[str, Any]:
    """Topology for drivers; awaitable when the client sends ``topologyVersion``/``maxAwaitTimeMS``."""
    topology = ctx.server.topology
    client = ctx.cmd.get("client")
    if isinstance(client, dict) and isinstance(client.get("application"), dict):
        ctx.conn.app_name = client["application"].get("name")
    client_version = ctx.cmd.get("topologyVersion")
    max_await = ctx.cmd.get("maxAwaitTimeMS")
    if client_version is not None and max_await is not None:
        if not isinstance(max_await, int) or isinstance(max_await, bool) or max_await < 0:
            raise command_error(BAD_VALUE, "maxAwaitTimeMS must be a non-negative integer")
        if (
            isinstance(client_version, dict)
            and client_version.get("processId") == topology.process_id
            and client_version.get("counter") == topology.counter
        ):
            topology.wait_for_change(topology.counter, max_await / 1000.0)
    config = ctx.server.config
    address = config.address
    last_ts = ctx.state.oplog.last_ts() or ctx.state.oplog.clock.current()
    last_date = datetime.datetime.fromtimestamp(last_ts.time, datetime.UTC).replace(tzinfo=None)
    writable = topology.primary
    legacy = ctx.name != "hello"
    reply: dict[str, Any] = {"topologyVersion": topology.version(), "hosts": [address], "setName": config.replset,
                             "setVersion": topology.set_version}  # fmt: skip
    if legacy:
        reply["ismaster"] = writable
    else:
        reply["isWritablePrimary"] = writable
    reply["secondary"] = not writable
    if writable:
        reply["primary"] = address
    reply["me"] = address
    reply["electionId"] = topology.election_id
    reply["lastWrite"] = {
        "opTime": _optime(last_ts, topology.term),
        "lastWriteDate": last_date,
        "majorityOpTime": _optime(last_ts, topology.term),
        "majorityWriteDate": last_date,
    }
    reply.update(
        maxBsonObjectSize=MAX_BSON_OBJECT_SIZE,
        maxMessageSizeBytes=MAX_MESSAGE_SIZE,
        maxWriteBatchSize=MAX_WRITE_BATCH_SIZE,
        localTime=now_ms(),
        logicalSessionTimeoutMinutes=30,
        connectionId=ctx.conn.id,
        minWireVersion=0,
        maxWireVersion=MAX_WIRE_VERSION,
        readOnly=False,
    )
    if ctx.cmd.get("helloOk") and legacy:
        reply["helloOk"] = True
    return reply


@command("ping")
def ping(ctx: Context) -> dict[str, Any]:
    return {}


@command("buildInfo", "buildinfo")
def build_info(ctx: Context) -> dict[str, Any]:
    return {
        "version": VERSION,
        "gitVersion": "mongocdc-emulator",
        "versionArray": VERSION_ARRAY,
        "modules": [],
        "allocator": "system",
        "javascriptEngine": "none",
        "sysInfo": "deprecated",
        "bits": 64,
        "debug": False,
        "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "storageEngines": ["wiredTiger"],
        "openssl": {"running": "disabled", "compiled": "disabled"},
        "buildEnvironment": {"target_os": platform.system().lower(), "target_arch": platform.machine()},
    }


@command("serverStatus")
def server_status(ctx: Context) -> dict[str, Any]:
    server = ctx.server
    oplog = ctx.state.oplog
    uptime = time.time() - server.started
    return {
        "host": socket.gethostname(),
        "version": VERSION,
        "process": "mongod",
        "pid": Int64(os.getpid()),
        "uptime": float(int(uptime)),
        "uptimeMillis": Int64(int(uptime * 1000)),
        "uptimeEstimate": Int64(int(uptime)),
        "localTime": now_ms(),
        "connections": {"current": server.connection_count(), "available": 50000,
                        "totalCreated": Int64(ctx.conn.id)},  # fmt: skip
        "repl": {
            "topologyVersion": server.topology.version(),
            "hosts": [server.config.address],
            "setName": server.config.replset,
            "setVersion": server.topology.set_version,
            "isWritablePrimary": server.topology.primary,
            "secondary": not server.topology.primary,
            "me": server.config.address,
            "electionId": server.topology.election_id,
        },
        "storageEngine": {"name": "wiredTiger", "supportsCommittedReads": True, "persistent": server.persistence is not None},
        "metrics": {"cursor": {"open": {"total": Int64(len(server.cursors))}}},
        "oplog": {"entries": Int64(len(oplog)), "sizeBytes": Int64(oplog.size_bytes()), "maxBytes": Int64(oplog.max_bytes)},
    }


@command("replSetGetStatus", admin_only=True)
def repl_set_get_status(ctx: Context) -> dict[str, Any]:
    server = ctx.server
    topology = server.topology
    last = ctx.state.oplog.last_ts() or ctx.state.oplog.clock.current()
    last_date = datetime.datetime.fromtimestamp(last.time, datetime.UTC).replace(tzinfo=None)
    optime = _optime(last, topology.term)
    return {
        "set": server.config.replset,
        "date": now_ms(),
        "myState": 1 if topology.primary else 2,
        "term": Int64(topology.term),
        "heartbeatIntervalMillis": Int64(2000),
        "optimes": {"lastCommittedOpTime": optime, "appliedOpTime": optime, "durableOpTime": optime,
                    "lastCommittedWallTime": last_date, "lastAppliedWallTime": last_date,
                    "lastDurableWallTime": last_date},  # fmt: skip
        "members": [
            {
                "_id": 0,
                "name": server.config.address,
                "health": 1.0,
                "state": 1 if topology.primary else 2,
                "stateStr": "PRIMARY" if topology.primary else "SECONDARY",
                "uptime": int(time.time() - server.started),
                "optime": optime,
                "optimeDate": last_date,
                "electionId": topology.election_id,
                "configVersion": topology.set_version,
                "configTerm": topology.term,
                "self": True,
            }
        ],
    }


@command("replSetGetConfig", admin_only=True)
def repl_set_get_config(ctx: Context) -> dict[str, Any]:
    server = ctx.server
    return {
        "config": {
            "_id": server.config.replset,
            "version": server.topology.set_version,
            "term": server.topology.term,
            "members": [{"_id": 0, "host": server.config.address, "priority": 1.0, "votes": 1}],
            "protocolVersion": Int64(1),
        }
    }


@command("endSessions", "killSessions", "killAllSessions", "killAllSessionsByPattern", "refreshSessions")
def end_sessions(ctx: Context) -> dict[str, Any]:
    value = ctx.arg
    if ctx.name in ("endSessions", "killSessions"):
        if not isinstance(value, list):
            raise command_error(TYPE_MISMATCH, f"BSON field '{ctx.name}' is the wrong type, expected an array")
        ctx.state.end_sessions([v for v in value if isinstance(v, dict)])
    elif ctx.name in ("killAllSessions", "killAllSessionsByPattern"):
        with ctx.state.lock:
            lsids = [s.lsid for s in ctx.state.sessions.values()]
        ctx.state.end_sessions(lsids)
    return {}


@command("startSession")
def start_session(ctx: Context) -> dict[str, Any]:
    import uuid

    from bson.binary import Binary

    return {"id": {"id": Binary.from_uuid(uuid.uuid4())}, "timeoutMinutes": 30}


@command("getParameter", admin_only=True)
def get_parameter(ctx: Context) -> dict[str, Any]:
    known: dict[str, Any] = {
        "featureCompatibilityVersion": {"version": "7.0"},
        "transactionLifetimeLimitSeconds": 60,
        "maxTransactionLockRequestTimeoutMillis": 5,
        "changeStreamOptions": {"preAndPostImages": {"expireAfterSeconds": "off"}},
        "authenticationMechanisms": ["SCRAM-SHA-1", "SCRAM-SHA-256"],
        "logLevel": 0,
        "internalQueryMaxBlockingSortMemoryUsageBytes": 104857600,
        "maxBSONDepth": 200,
        "periodicNoopIntervalSecs": int(ctx.server.config.noop_interval),
        # mongod started with --setParameter enableTestCommands=1 (configureFailPoint needs it).
        "enableTestCommands": True,
    }
    arg = ctx.arg
    if arg == "*" or (isinstance(arg, dict) and arg.get("allParameters")):
        return dict(known)
    wanted = [k for k in ctx.cmd if k not in (ctx.name, "$db", "lsid", "$clusterTime", "$readPreference", "comment")]
    result = {k: known[k] for k in wanted if k in known}
    if not result:
        raise command_error(BAD_VALUE, "no option found to get")
    return result


@command("setParameter", admin_only=True)
def set_parameter(ctx: Context) -> dict[str, Any]:
    return {"was": None}


@command("whatsmyuri")
def whats_my_uri(ctx: Context) -> dict[str, Any]:
    return {"you": ctx.conn.peer}


@command("hostInfo")
def host_info(ctx: Context) -> dict[str, Any]:
    return {
        "system": {
            "currentTime": now_ms(),
            "hostname": socket.gethostname(),
            "cpuAddrSize": 64,
            "numCores": os.cpu_count() or 1,
            "cpuArch": platform.machine(),
        },
        "os": {"type": platform.system(), "name": platform.platform(), "version": platform.release()},
        "extra": {},
    }


@command("getCmdLineOpts", admin_only=True)
def get_cmd_line_opts(ctx: Context) -> dict[str, Any]:
    config = ctx.server.config
    argv = ["mongocdc-emulator", "--port", str(config.port), "--replSet", config.replset]
    parsed: dict[str, Any] = {"net": {"port": config.port, "bindIp": config.host}, "replication": {"replSet": config.replset}}
    if config.dbpath:
        parsed["storage"] = {"dbPath": config.dbpath}
    return {"argv": argv, "parsed": parsed}


@command("getLog", admin_only=True)
def get_log(ctx: Context) -> dict[str, Any]:
    if ctx.arg == "*":
        return {"names": ["global", "startupWarnings"]}
    return {"totalLinesWritten": 0, "log": []}


@command("listCommands")
def list_commands(ctx: Context) -> dict[str, Any]:
    from . import COMMANDS

    return {"commands": {name: {"help": "", "adminOnly": spec.admin_only} for name, spec in sorted(COMMANDS.items())}}


@command("getFreeMonitoringStatus", admin_only=True)
def free_monitoring(ctx: Context) -> dict[str, Any]:
    return {"state": "disabled"}


@command("commitTransaction", admin_only=True, in_transaction=True)
def commit_transaction(ctx: Context) -> dict[str, Any]:
    if ctx.session is None or "txnNumber" not in ctx.cmd:
        raise command_error((50768, "InvalidOptions"), "commitTransaction must be run within a transaction")
    ctx.state.commit_transaction(ctx.session, int(ctx.cmd["txnNumber"]))
    return {}


@command("abortTransaction", admin_only=True, in_transaction=True)
def abort_transaction(ctx: Context) -> dict[str, Any]:
    if ctx.session is None or "txnNumber" not in ctx.cmd:
        raise command_error((50768, "InvalidOptions"), "abortTransaction must be run within a transaction")
    ctx.state.abort_transaction(ctx.session, int(ctx.cmd["txnNumber"]))
    return {}


@command("currentOp", admin_only=True)
def current_op(ctx: Context) -> dict[str, Any]:
    return {"inprog": []}


@command("fsync", admin_only=True)
def fsync(ctx: Context) -> dict[str, Any]:
    if ctx.server.persistence is not None:
        ctx.server.persistence.checkpoint()
    return {"numFiles": 1}


@command("appendOplogNote", admin_only=True)
def append_oplog_note(ctx: Context) -> dict[str, Any]:
    ctx.state.write_noop(str(ctx.cmd.get("data", "note")))
    return {}
