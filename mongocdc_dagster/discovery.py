"""Which collections the connector captures, found in MongoDB when definitions load, kept as state.

The component stores this as Dagster defs state each time a code location loads, so a run worker
builds the same definitions from the stored version without reaching MongoDB, and a load while
MongoDB cannot be reached builds the last discovered collections (``from_store``, with the ``error``
that forced it). With no stored state either, the definitions load with no collections rather than
taking the whole code location down; the discovery sensor reports either case.

A collection captured before and gone since (dropped, or left out by the filters) stays in the state for
:data:`KEEP_DROPPED`, marked with when discovery found it gone (``dropped_at``): its assets stay in the
definitions, so its history, its runs' graph and the retries of runs that name it keep working (Dagster
cannot re-run a run whose assets left the definitions), and no new slices are requested for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import orjson
from pymongo.errors import PyMongoError

from mongocdc_core.config import ConfigError
from mongocdc_core.source.errors import CdcError
from mongocdc_dagster.resources import MongoCdcResource

#: Version 2 added ``dropped_at``. A version-1 reader (an older mongocdc, after a rollback) rejects a version-2
#: state, as it would otherwise read the dropped collections as captured; this one reads both.
STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)
DISCOVERY_TIMEOUT_MS = 5000
#: How long a dropped collection's assets stay after discovery found it gone.
KEEP_DROPPED = timedelta(days=7)


class DiscoveryError(Exception):
    """MongoDB could not be listed, so there is no state to store (the last stored one stays)."""


@dataclass(frozen=True)
class CollectionInfo:
    """One captured collection and its estimated size (for progress totals and range plans); ``dropped_at``:
    no longer captured since then (its assets are kept, see the module's docstring)."""

    namespace: str
    estimated_documents: int | None = None
    dropped_at: datetime | None = None


@dataclass(frozen=True)
class DiscoveryState:
    """The captured collections at ``discovered_at`` and where the oplog started then."""

    collections: tuple[CollectionInfo, ...]
    discovered_at: datetime
    oplog_first: datetime | None = None
    error: str | None = None
    #: Built from the stored defs state because MongoDB could not be listed (``error`` says why); not stored.
    from_store: bool = False
    namespaces: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespaces", tuple(c.namespace for c in self.collections))

    @property
    def captured(self) -> tuple[str, ...]:
        """The collections captured when discovered (``namespaces`` without the dropped ones)."""
        return tuple(c.namespace for c in self.collections if c.dropped_at is None)

    @property
    def dropped(self) -> dict[str, datetime]:
        """Dropped collection -> when discovery found it gone."""
        return {c.namespace: c.dropped_at for c in self.collections if c.dropped_at is not None}

    def keeping_dropped(self, previous: DiscoveryState | None) -> DiscoveryState:
        """This discovery with the collections of ``previous`` it no longer finds kept as dropped (since when
        ``previous`` says, else since this discovery), for :data:`KEEP_DROPPED`."""
        if previous is None:
            return self
        found = set(self.namespaces)
        kept = [replace(c, dropped_at=c.dropped_at or self.discovered_at) for c in previous.collections
                if c.namespace not in found]
        kept = [c for c in kept if c.dropped_at is not None and self.discovered_at - c.dropped_at <= KEEP_DROPPED]
        collections = tuple(sorted((*self.collections, *kept), key=lambda c: c.namespace))
        return replace(self, collections=collections)

    @property
    def stored_note(self) -> str:
        """What a load while MongoDB could not be listed says (a warning at load, and the discovery sensor)."""
        if not self.from_store:
            return (f"MongoDB could not be listed when the code location loaded ({self.error}) and no collections "
                    "are stored as defs state yet, so the definitions have none; reload the code location once "
                    "MongoDB answers")
        return (f"MongoDB could not be listed when the code location loaded ({self.error}); its definitions were "
                f"built from the {len(self.collections)} collection(s) stored as defs state at "
                f"{self.discovered_at.isoformat(timespec='seconds')}; reload the code location once MongoDB answers")

    def to_json(self) -> str:
        return orjson.dumps({
            "version": STATE_VERSION,
            "collections": [{"namespace": c.namespace, "estimated_documents": c.estimated_documents,
                             "dropped_at": c.dropped_at.isoformat() if c.dropped_at else None}
                            for c in self.collections],
            "discovered_at": self.discovered_at.isoformat(),
            "oplog_first": self.oplog_first.isoformat() if self.oplog_first else None,
            "error": self.error,
        }).decode()

    @classmethod
    def from_json(cls, text: str) -> DiscoveryState:
        data = orjson.loads(text)
        if not isinstance(data, dict) or data.get("version") not in _READABLE_VERSIONS:
            raise ValueError(f"not a mongocdc discovery state (version {STATE_VERSION}): {text[:200]!r}")
        return cls(
            collections=tuple(CollectionInfo(c["namespace"], c.get("estimated_documents"),
                                             datetime.fromisoformat(c["dropped_at"]) if c.get("dropped_at") else None)
                              for c in data["collections"]),
            discovered_at=datetime.fromisoformat(data["discovered_at"]),
            oplog_first=datetime.fromisoformat(data["oplog_first"]) if data.get("oplog_first") else None,
            error=data.get("error"),
        )

    @classmethod
    def of(cls, namespaces: Sequence[str], oplog_first: datetime | None = None) -> DiscoveryState:
        """A state naming collections directly (tests, a deployment that lists them)."""
        return cls(tuple(CollectionInfo(ns) for ns in sorted(namespaces)), datetime.now(UTC), oplog_first)


def discover(mongocdc: MongoCdcResource) -> DiscoveryState:
    """The captured collections (the connector's include/exclude filters, without the signaling
    collection) with their estimated sizes, and the oplog's first entry; an error is kept, not raised."""
    now = datetime.now(UTC)
    # a definitions load must not wait out the connector's reconnection schedule (minutes)
    cfg = mongocdc.load_config().with_properties(
        {"connect.max.attempts": "1", "mongodb.server.selection.timeout.ms": str(DISCOVERY_TIMEOUT_MS)})
    try:
        namespaces = mongocdc.captured_collections(cfg)
        counts = mongocdc.estimated_counts(namespaces, cfg)
        try:
            window = mongocdc.oplog_window(cfg)
            first: datetime | None = datetime.fromtimestamp(window.first.time, UTC)
        except CdcError:
            first = None  # mongos or missing privileges: windows then start at the configured default
    except (CdcError, ConfigError, PyMongoError) as exc:
        return DiscoveryState((), now, None, f"{type(exc).__name__}: {exc}")
    return DiscoveryState(tuple(CollectionInfo(ns, counts.get(ns)) for ns in namespaces), now, first)


def discover_or_raise(mongocdc: MongoCdcResource) -> DiscoveryState:
    """What :func:`discover` finds, to be stored; raises :class:`DiscoveryError` instead of returning an
    error state, so an unreachable MongoDB never overwrites the last stored collections."""
    state = discover(mongocdc)
    if state.error is not None:
        raise DiscoveryError(state.error)
    return state
