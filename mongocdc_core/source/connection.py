"""Connecting to MongoDB: client from the config, topology check, reconnection with backoff.

The connector needs an oplog, so a replica set or a sharded cluster (through mongos) is accepted
and a standalone server is refused with the explanation the Debezium documentation gives. When
MongoDB is unreachable the engine retries with exponential backoff (``connect.backoff.*``,
``connect.max.attempts``) instead of failing on the first network error.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from bson.codec_options import DatetimeConversion
from pymongo import MongoClient, monitoring
from pymongo.errors import (
    AutoReconnect,
    ConnectionFailure,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from pymongo.server_type import SERVER_TYPE

from mongocdc_core.config import ConnectorConfig
from mongocdc_core.config.uri import replica_set_uri
from mongocdc_core.metrics import ConnectorMetrics
from mongocdc_core.receiver import ConnectionState
from mongocdc_core.source.errors import (
    AuthenticationError,
    CdcError,
    ConnectError,
    PrivilegeError,
    Stopped,
    TlsError,
    TopologyError,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

_AUTH_FAILED = frozenset({18})  # AuthenticationFailed
UNAUTHORIZED = 13
# OpenSSL's reason when it refuses a peer's certificate (untrusted issuer, expired, wrong host name).
_TLS_REFUSED = "CERTIFICATE_VERIFY_FAILED"

# mongod codes after which the same operation succeeds once a (new) primary is reachable.
_RETRIABLE_CODES = frozenset(
    {
        6,  # HostUnreachable
        7,  # HostNotFound
        89,  # NetworkTimeout
        91,  # ShutdownInProgress
        189,  # PrimarySteppedDown
        262,  # ExceededTimeLimit
        9001,  # SocketException
        10107,  # NotWritablePrimary
        11600,  # InterruptedAtShutdown
        11602,  # InterruptedDueToReplStateChange
        13435,  # NotPrimaryNoSecondaryOk
        13436,  # NotPrimaryOrSecondary
        43,  # CursorNotFound (the cursor died with its connection)
        237,  # CursorKilled
        133,  # FailedToSatisfyReadPreference
        150,  # StaleEpoch
        234,  # RetryChangeStream
    }
)


def is_retriable(exc: BaseException) -> bool:
    """Whether reconnecting and resuming from the last position can fix ``exc``."""
    if isinstance(exc, (AutoReconnect, ConnectionFailure, NetworkTimeout, NotPrimaryError, ServerSelectionTimeoutError)):
        return True
    if isinstance(exc, OperationFailure):
        if exc.has_error_label("ResumableChangeStreamError") or exc.has_error_label("RetryableWriteError"):
            return True
        return exc.code in _RETRIABLE_CODES
    return False


def refused(exc: PyMongoError, what: str, user: str | None = None) -> CdcError | None:
    """The connector error for a server that refused the connector (TLS, credentials, privileges), if it did.

    These never heal by retrying, so they end the run with a message that names the fix.
    """
    text = str(exc)
    if _TLS_REFUSED in text:
        reason = text.split("certificate verify failed:", 1)[-1].split(" (_ssl.c", 1)[0].strip(" :")
        return TlsError(
            f"{what}: the TLS certificate of MongoDB was refused ({reason or 'certificate verify failed'}). "
            "A certificate from a private CA is trusted with tlsCAFile=<ca.pem> in mongodb.connection.string; "
            "one issued for another host name is accepted with mongodb.ssl.invalid.hostname.allowed=true "
            "(which gives up protection against impersonation)."
        )
    if isinstance(exc, OperationFailure) and exc.code in _AUTH_FAILED:
        return AuthenticationError(
            f"{what}: MongoDB refused the credentials of mongodb.connection.string "
            f"({code_name(exc) or 'AuthenticationFailed'}): check the user, password and authSource"
        )
    if isinstance(exc, OperationFailure) and exc.code == UNAUTHORIZED:
        who = f"MongoDB user {user!r}" if user else "the connector's MongoDB user"
        return PrivilegeError(
            f"{what}: {who} lacks a privilege this needs ({one_line(exc)}). The connector needs: read on "
            "the captured databases (readAnyDatabase with capture.scope=deployment, which also needs the "
            "cluster-wide find and changeStream actions), read on local to check the oplog window, write on "
            "the signaling collection for incremental snapshots, and, on sharded clusters, read on config.shards."
        )
    return None


@dataclass(frozen=True)
class Topology:
    """What ``hello`` said about the deployment (and, through mongos, ``config.shards``)."""

    kind: str  # "replica_set" or "sharded"
    set_name: str | None
    hosts: tuple[str, ...]
    shards: tuple[str, ...] = ()

    @property
    def source_name(self) -> str:
        """The source block's ``rs``: the replica set, or ``cluster`` through mongos (Debezium's name for a
        connection to a sharded cluster, whose events come from every shard)."""
        return self.set_name or ("cluster" if self.kind == "sharded" else "")


class _DisconnectListener(monitoring.ConnectionPoolListener):
    """Reports a loss: the driver lost a server and cleared its connection pool (network errors,
    shutdown errors), whether the failing operation was the engine's or the driver's own monitoring.

    ``ConnectorMetrics.connection_lost`` counts each loss once, whoever reports it first.
    """

    def __init__(self, metrics: ConnectorMetrics | None) -> None:
        self.metrics = metrics

    def pool_cleared(self, event: monitoring.PoolClearedEvent) -> None:
        if self.metrics is not None:
            self.metrics.connection_lost()

    # Events that say nothing about disconnects.
    def pool_created(self, event: monitoring.PoolCreatedEvent) -> None:
        """Not counted."""

    def pool_ready(self, event: monitoring.PoolReadyEvent) -> None:
        """Not counted (the heartbeat that made the pool ready reports the server back)."""

    def pool_closed(self, event: monitoring.PoolClosedEvent) -> None:
        """Not counted."""

    def connection_created(self, event: monitoring.ConnectionCreatedEvent) -> None:
        """Not counted."""

    def connection_ready(self, event: monitoring.ConnectionReadyEvent) -> None:
        """Not counted."""

    def connection_closed(self, event: monitoring.ConnectionClosedEvent) -> None:
        """Not counted (a clear closes many connections; the clear itself is the disconnect)."""

    def connection_check_out_started(self, event: monitoring.ConnectionCheckOutStartedEvent) -> None:
        """Not counted."""

    def connection_check_out_failed(self, event: monitoring.ConnectionCheckOutFailedEvent) -> None:
        """Not counted."""

    def connection_checked_out(self, event: monitoring.ConnectionCheckedOutEvent) -> None:
        """Not counted."""

    def connection_checked_in(self, event: monitoring.ConnectionCheckedInEvent) -> None:
        """Not counted."""


_SERVING = (SERVER_TYPE.RSPrimary, SERVER_TYPE.Mongos)


class _PrimaryListener(monitoring.ServerHeartbeatListener):
    """Follows the servers the connector reads from (the primary, or the mongos routers) in the monitors'
    heartbeats: the last of them failing or stepping down is a loss, and a primary's ``electionId`` goes to
    ``ConnectorMetrics.primary_seen`` (which counts elections). A heartbeat ends a loss only with a new
    ``topologyVersion`` (a restarted server, a primary elected again): a reply still in flight when a
    server goes down carries the old one. Otherwise the connector's own next read ends it.

    Heartbeat replies arrive in the monitor's own thread. A server-description listener would say the
    same, but only through the driver's event thread, which ``MongoClient.close`` waits for (half a
    second at the end of every run).
    """

    def __init__(self, metrics: ConnectorMetrics | None) -> None:
        self.metrics = metrics
        self._serving: set[Any] = set()
        self._versions: dict[Any, Any] = {}  # the last topologyVersion each server replied with
        self._lock = threading.Lock()

    def started(self, event: monitoring.ServerHeartbeatStartedEvent) -> None:
        """Nothing to count before the reply."""

    def failed(self, event: monitoring.ServerHeartbeatFailedEvent) -> None:
        self._not_serving(event.connection_id)

    def succeeded(self, event: monitoring.ServerHeartbeatSucceededEvent) -> None:
        if self.metrics is None:
            return
        reply = event.reply
        if reply.server_type not in _SERVING:
            with self._lock:
                self._versions[event.connection_id] = reply.topology_version
            self._not_serving(event.connection_id)
            return
        with self._lock:
            self._serving.add(event.connection_id)
            previous = self._versions.get(event.connection_id)
            self._versions[event.connection_id] = reply.topology_version
        if previous is not None and reply.topology_version != previous:
            self.metrics.connection_restored(None)
        if reply.server_type == SERVER_TYPE.RSPrimary and reply.election_id is not None:
            self.metrics.primary_seen(reply.replica_set_name or "", reply.election_id)

    def _not_serving(self, address: Any) -> None:
        """``address`` no longer serves reads (unreachable, or a primary that stepped down)."""
        if self.metrics is None:
            return
        with self._lock:
            if address not in self._serving:
                return
            self._serving.discard(address)
            lost = not self._serving
        if lost:
            self.metrics.connection_lost()


def open_client(cfg: ConnectorConfig, metrics: ConnectorMetrics | None = None, **overrides: Any) -> MongoClient[Any]:
    """A MongoClient for ``mongodb.connection.string`` with the config's driver options."""
    kwargs: dict[str, Any] = dict(cfg.connection_kwargs())
    kwargs.setdefault("tz_aware", True)
    # MongoDB stores dates as any 64-bit millisecond count; those outside Python's datetime range
    # (beyond year 9999, before year 1) decode as DatetimeMS instead of failing the whole batch.
    kwargs["datetime_conversion"] = DatetimeConversion.DATETIME_AUTO
    kwargs.update(overrides)
    listeners = list(kwargs.pop("event_listeners", []))
    listeners += [_PrimaryListener(metrics), _DisconnectListener(metrics)]
    return MongoClient(cfg.mongodb_connection_string, event_listeners=listeners, **kwargs)


def check_topology(client: MongoClient[Any]) -> Topology:
    """Accept a replica set or mongos; refuse a standalone server (it has no oplog)."""
    hello = client.admin.command("hello")
    if hello.get("msg") == "isdbgrid":
        return Topology("sharded", None, tuple(hello.get("hosts", ())), shard_names(client))
    if hello.get("setName"):
        return Topology("replica_set", hello["setName"], tuple(hello.get("hosts", ())))
    address = client.address
    where = f"{address[0]}:{address[1]}" if address else "the configured server"
    raise TopologyError(
        f"mongodb.connection.string points at a standalone MongoDB server ({where}). The MongoDB "
        "connector captures changes from replica sets and sharded clusters only: a standalone server "
        "has no oplog, so it has no change streams. Convert it to a single-member replica set "
        "(start mongod with --replSet and run rs.initiate()) and connect with ?replicaSet=<name>."
    )


def shard_names(client: MongoClient[Any]) -> tuple[str, ...]:
    """The shards of a sharded cluster (``config.shards``), as Debezium reads them at start.

    Reading them needs read on ``config.shards``; without it the connector still captures (the
    change stream through mongos covers every shard) and says so once.
    """
    try:
        names = tuple(shard_hosts(client))
    except OperationFailure as exc:
        log.warning("unable to read the shards of the sharded cluster from config.shards (%s); capturing through "
                    "mongos continues", one_line(exc))  # fmt: skip
        return ()
    log.info("capturing a sharded cluster through mongos: shards %s", ", ".join(names) or "none")
    return names


def shard_hosts(client: MongoClient[Any]) -> dict[str, str]:
    """Each shard's ``host`` in ``config.shards`` (``<replica set>/<host:port>,...``), by shard name."""
    return {str(doc["_id"]): str(doc["host"]) for doc in client.config.shards.find({}, {"_id": 1, "host": 1})}


def open_shard_client(cfg: ConnectorConfig, shard_host: str) -> MongoClient[Any]:
    """A client of one shard's replica set, with the connector's credentials, TLS and driver options."""
    uri = replica_set_uri(cfg.mongodb_connection_string, shard_host)
    return open_client(cfg.with_properties({"mongodb.connection.string": uri}))


class Backoff:
    """Debezium's reconnection delays: initial, doubled after each failure, capped, limited attempts.

    With the defaults (1000 ms, 120000 ms, 16 attempts) the delays are 1, 2, 4, ... 64, 120, 120 ...
    seconds, just over 20 minutes in total, as the seed's table shows.
    """

    def __init__(self, initial_ms: int, max_ms: int, max_attempts: int) -> None:
        if initial_ms < 0 or max_ms < 0:
            raise ValueError("connect.backoff.initial.delay.ms and connect.backoff.max.delay.ms must be >= 0")
        if max_attempts < 1:
            raise ValueError(f"connect.max.attempts must be a positive integer, got {max_attempts}")
        self.initial_ms = initial_ms
        self.max_ms = max(max_ms, initial_ms)
        self.max_attempts = max_attempts

    @classmethod
    def from_config(cls, cfg: ConnectorConfig) -> Backoff:
        return cls(
            int(cfg.connect_backoff_initial_delay_ms),
            int(cfg.connect_backoff_max_delay_ms),
            int(cfg.connect_max_attempts),
        )

    def delay_ms(self, attempt: int) -> int:
        """Delay before reconnection attempt ``attempt`` (1-based)."""
        return int(min(self.initial_ms * (2 ** min(attempt - 1, 40)), self.max_ms))

    def run(
        self,
        operation: Callable[[], T],
        *,
        what: str,
        stop: threading.Event | None = None,
        on_retry: Callable[[ConnectionState], None] | None = None,
        hosts: str = "MongoDB",
    ) -> T:
        """Run ``operation``; on retriable errors wait and retry up to ``max_attempts`` times.

        With ``stop``, each attempt is also abandoned as soon as ``stop`` is set (a server
        selection can block for ``serverSelectionTimeoutMS``), raising :class:`Stopped`.
        """
        attempt = 0
        while True:
            try:
                return operation() if stop is None else _until_stopped(operation, stop)
            except PyMongoError as exc:
                failure = refused(exc, what)
                if failure is not None:
                    raise failure from exc
                if not is_retriable(exc):
                    raise
                attempt += 1
                if attempt > self.max_attempts:
                    raise ConnectError(
                        f"{what}: {hosts} unreachable after {self.max_attempts} reconnection attempts "
                        f"(connect.max.attempts): {one_line(exc)}"
                    ) from exc
                delay_s = self.delay_ms(attempt) / 1000
                if on_retry is not None:
                    on_retry(ConnectionState(hosts, attempt, self.max_attempts, delay_s, one_line(exc)))
                if (stop or threading.Event()).wait(delay_s):
                    raise Stopped(f"{what}: stopped while MongoDB was unreachable") from exc


def _until_stopped(operation: Callable[[], T], stop: threading.Event) -> T:
    """Run ``operation`` on a helper thread; give up waiting for it (``Stopped``) once ``stop`` is set."""
    if stop.is_set():
        raise Stopped("stopped before connecting")
    done = threading.Event()
    outcome: list[T] = []
    failure: list[BaseException] = []

    def attempt() -> None:
        try:
            outcome.append(operation())
        except BaseException as exc:  # handed to the waiting thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=attempt, name="mongocdc-connect", daemon=True).start()
    while not done.wait(0.1):
        if stop.is_set():
            raise Stopped("stopped while connecting")
    if failure:
        raise failure[0]
    return outcome[0]


def code_name(exc: OperationFailure) -> str | None:
    """The server's name for an error code (``codeName``), when it sent one."""
    details = exc.details if isinstance(exc.details, Mapping) else {}  # a stream's error: a RawChange
    name = details.get("codeName")
    return name if isinstance(name, str) else None


def one_line(exc: BaseException) -> str:
    """An error's message on one line, without the driver's full server reply or topology dump."""
    text = str(exc)
    for tail in (", full error:", ", Timeout:", " (configured timeouts:"):
        text = text.split(tail)[0]
    return " ".join(text.split())


def hosts_of(client: MongoClient[Any]) -> str:
    """The seed hosts a client tries, ``host:port`` comma-separated (never the credentials)."""
    seeds = client.topology_description.server_descriptions().keys()
    return ",".join(f"{host}:{port}" for host, port in seeds) or "the configured MongoDB"


def connect(
    cfg: ConnectorConfig,
    metrics: ConnectorMetrics | None = None,
    stop: threading.Event | None = None,
    on_retry: Callable[[ConnectionState], None] | None = None,
) -> tuple[MongoClient[Any], Topology]:
    """Open a client and check the topology, retrying with backoff while MongoDB is unreachable.

    Raises :class:`Stopped` when ``stop`` is set before a connection was made.
    """
    client = open_client(cfg, metrics)
    asked = 0

    def attempt() -> Topology:
        nonlocal asked
        asked = metrics.losses if metrics is not None else 0  # read as this attempt asks, not before the first
        return check_topology(client)

    try:
        topology = Backoff.from_config(cfg).run(
            attempt, what="connecting", stop=stop, on_retry=on_retry, hosts=hosts_of(client),
        )
    except BaseException:
        client.close()
        raise
    if metrics is not None:
        metrics.streaming.Connected = True
        metrics.connection_restored(asked)
    return client, topology
