"""Where a sharded cluster keeps its data: databases, unsharded collections, and chunks of sharded ones.

The emulated mongos routes every command with it, as mongos does with the config servers'
routing table. A database has a primary shard holding its unsharded collections (an unsharded
collection can also be placed on another shard, as MongoDB 8.0's ``moveCollection`` does); a
sharded collection is split on its shard key into chunks, ``[min, max)`` ranges each on one shard.

The layout is built from a JSON document (``--layout`` or the fixture's ``layout``)::

    {"databases": {"inventory": "shard0"},
     "collections": {"inventory.orders": {"key": {"_id": 1}, "chunks": [{"max": 1000, "shard": "shard0"},
                                                                          {"shard": "shard1"}]},
                     "inventory.customers": {"shard": "shard1"}}}

or at run time with mongos's own commands: ``enableSharding``, ``shardCollection``, ``split``,
``moveChunk`` (the mongos migrates the chunk's documents; here only its owner and version change).
Each chunk has mongod's version (``lastmod``: the major part grows with each migration, the minor
with each split), as ``config.chunks`` shows it.
"""

from __future__ import annotations

import datetime
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bson import MaxKey, MinKey, ObjectId, Timestamp
from bson.binary import Binary

from . import matching
from .errors import BAD_VALUE, ILLEGAL_OPERATION, NAMESPACE_NOT_FOUND, command_error

SHARD_KEY_NOT_FOUND = (61, "ShardKeyNotFound")
SortKey = tuple[Any, ...]


def _bound(key: Mapping[str, Any], value: Any, what: str) -> tuple[SortKey, ...] | None:
    """A chunk bound as sort keys per shard key field (None: MinKey/MaxKey, the open end)."""
    if value is None or isinstance(value, (MinKey, MaxKey)):
        return None
    fields = list(key)
    if isinstance(value, Mapping):
        if list(value) != fields:
            raise ValueError(f"{what} {dict(value)} must name the shard key fields {fields} in order")
        values = list(value.values())
    elif isinstance(value, list) and len(fields) > 1:
        values = value
    else:
        values = [value]
    if len(values) != len(fields):
        raise ValueError(f"{what} {value!r} must give one value per shard key field {fields}")
    if any(isinstance(v, (MinKey, MaxKey)) for v in values):
        raise ValueError(f"{what} {value!r}: MinKey/MaxKey only as a whole bound")
    return tuple(matching.bson_sort_key(v) for v in values)


@dataclass
class Chunk:
    low: tuple[SortKey, ...] | None  # None: from MinKey
    high: tuple[SortKey, ...] | None  # None: to MaxKey
    shard: str
    low_doc: dict[str, Any]
    high_doc: dict[str, Any]
    version: tuple[int, int] = (1, 0)  # (major, minor), config.chunks' lastmod
    since: Timestamp | None = None  # when it came to its shard (None: from the start)

    def holds(self, point: tuple[SortKey, ...]) -> bool:
        return (self.low is None or point >= self.low) and (self.high is None or point < self.high)


@dataclass
class ShardedCollection:
    key: dict[str, Any]
    chunks: list[Chunk]
    epoch: ObjectId = field(default_factory=ObjectId)
    uuid: uuid.UUID = field(default_factory=uuid.uuid4)

    def point(self, doc: Mapping[str, Any]) -> tuple[SortKey, ...]:
        """The shard key of a document (a missing field counts as null, as mongod does)."""
        return tuple(matching.bson_sort_key(matching.get_path(doc, f)) for f in self.key)

    def chunk_for(self, point: tuple[SortKey, ...]) -> Chunk:
        return next(c for c in self.chunks if c.holds(point))

    def shards(self) -> list[str]:
        return list(dict.fromkeys(c.shard for c in self.chunks))

    def version(self) -> tuple[int, int]:
        """The collection's version: its newest chunk's."""
        return max(c.version for c in self.chunks)


def _bound_doc(key: Mapping[str, Any], value: Any, low: bool) -> dict[str, Any]:
    if value is None or isinstance(value, (MinKey, MaxKey)):
        return {f: MinKey() if low else MaxKey() for f in key}
    if isinstance(value, Mapping):
        return dict(value)
    values = value if isinstance(value, list) and len(key) > 1 else [value]
    return dict(zip(key, values, strict=True))


def _equality(query: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    """Whether ``query`` pins ``path`` to one value (``{path: v}`` or ``{path: {$eq: v}}``), and the value."""
    if path in query:
        value = query[path]
        if isinstance(value, Mapping) and value and all(str(k).startswith("$") for k in value):
            if set(value) == {"$eq"}:
                return True, value["$eq"]
            return False, None
        return True, value
    clauses = query.get("$and")
    if isinstance(clauses, list):
        for clause in clauses:
            if isinstance(clause, Mapping):
                found, value = _equality(clause, path)
                if found:
                    return True, value
    return False, None


class Layout:
    """The routing table: shards, database primaries, placed and sharded collections."""

    def __init__(self, shards: Sequence[str], hosts: Mapping[str, str]) -> None:
        self.shards = list(shards)
        self.hosts = dict(hosts)  # shard name -> "name/host:port"
        self.primaries: dict[str, str] = {}
        self.placed: dict[str, str] = {}
        self.sharded: dict[str, ShardedCollection] = {}
        self.lock = threading.RLock()
        self.topology_time = Timestamp(int(datetime.datetime.now(datetime.UTC).timestamp()), 1)

    # -- configuration -----------------------------------------------------------------------------
    def load(self, spec: Mapping[str, Any]) -> None:
        """Apply a layout document (see the module docstring); ``ValueError`` names what is wrong."""
        if not isinstance(spec, Mapping) or not set(spec) <= {"databases", "collections"}:
            raise ValueError("a layout is a JSON object with 'databases' and/or 'collections'")
        for db, shard in dict(spec.get("databases", {})).items():
            self.primaries[db] = self._shard(shard, f"database {db}")
        for ns, entry in dict(spec.get("collections", {})).items():
            if "." not in ns or not isinstance(entry, Mapping):
                raise ValueError(f"collection {ns!r}: expected '<db>.<collection>': {{'shard': ...}} or {{'key': ..., 'chunks': [...]}}")
            if "key" in entry:
                self.shard_collection(ns, entry["key"], entry.get("chunks") or [{"shard": self.primary(ns.split(".", 1)[0])}])
            else:
                self.placed[ns] = self._shard(entry.get("shard"), f"collection {ns}")

    def _shard(self, name: Any, what: str) -> str:
        if name not in self.shards:
            raise ValueError(f"{what}: unknown shard {name!r} (shards: {', '.join(self.shards)})")
        return str(name)

    def primary(self, db: str) -> str:
        with self.lock:
            return self.primaries.setdefault(db, self.shards[0])

    def shard_collection(self, ns: str, key: Any, chunks: Sequence[Mapping[str, Any]]) -> None:
        """Declare ``ns`` sharded on ``key`` with ``chunks`` (ascending ``max`` bounds, the last open)."""
        if not isinstance(key, Mapping) or not key or any(v not in (1, 1.0) for v in key.values()):
            raise ValueError(f"collection {ns}: the shard key must be a non-empty document of ascending fields, got {key!r}"
                             " (hashed keys are not supported by the emulator)")  # fmt: skip
        key = dict(key)
        built: list[Chunk] = []
        low: tuple[SortKey, ...] | None = None
        low_value: Any = None
        for i, entry in enumerate(chunks):
            shard = self._shard(entry.get("shard"), f"collection {ns} chunk {i}")
            last = i == len(chunks) - 1
            if last != ("max" not in entry):
                raise ValueError(f"collection {ns}: every chunk but the last needs 'max'; the last covers the rest")
            high_value = entry.get("max")
            high = _bound(key, high_value, f"collection {ns} chunk {i} max")
            if high is not None and low is not None and high <= low:
                raise ValueError(f"collection {ns}: chunk bounds must ascend ({high_value!r} after {low_value!r})")
            built.append(Chunk(low, high, shard, _bound_doc(key, low_value, True), _bound_doc(key, high_value, False), (1, i)))
            low, low_value = high, high_value
        if not built:
            raise ValueError(f"collection {ns}: at least one chunk")
        with self.lock:
            self.placed.pop(ns, None)
            self.sharded[ns] = ShardedCollection(key, built)

    # -- routing -----------------------------------------------------------------------------------
    def owners(self, ns: str) -> list[str]:
        """Every shard that may hold documents of ``ns`` (the db primary first, as it coordinates)."""
        db = ns.split(".", 1)[0]
        with self.lock:
            sharded = self.sharded.get(ns)
            if sharded is None:
                return [self.placed.get(ns) or self.primary(db)]
            return sharded.shards()

    def shard_for(self, ns: str, doc: Mapping[str, Any]) -> str:
        """The shard a new document of ``ns`` belongs on."""
        with self.lock:
            sharded = self.sharded.get(ns)
            if sharded is None:
                return self.owners(ns)[0]
            return sharded.chunk_for(sharded.point(doc)).shard

    def target(self, ns: str, query: Mapping[str, Any] | None) -> list[str]:
        """The shards a query must visit: one when it pins the whole shard key, else every owner."""
        with self.lock:
            sharded = self.sharded.get(ns)
            if sharded is None or not isinstance(query, Mapping):
                return self.owners(ns)
            values = []
            for path in sharded.key:
                found, value = _equality(query, path)
                if not found or isinstance(value, Mapping) and any(str(k).startswith("$") for k in value):
                    return sharded.shards()
                values.append(value)
            point = tuple(matching.bson_sort_key(v) for v in values)
            return [sharded.chunk_for(point).shard]

    def is_sharded(self, ns: str) -> bool:
        with self.lock:
            return ns in self.sharded

    def upsert_shard(self, ns: str, query: Mapping[str, Any]) -> str:
        """The shard of an upsert: its query must pin the whole shard key (mongod's rule)."""
        targets = self.target(ns, query)
        if self.is_sharded(ns) and len(targets) != 1:
            raise command_error(SHARD_KEY_NOT_FOUND, f"Failed to target upsert by query :: could not extract exact shard key from {dict(query)}")
        return targets[0]

    # -- changing chunks at run time (mongos commands) ---------------------------------------------------
    def split(self, ns: str, middle: Mapping[str, Any]) -> None:
        with self.lock:
            sharded = self._sharded(ns)
            point = _bound(sharded.key, middle, "middle")
            assert point is not None
            chunk = sharded.chunk_for(point)
            if chunk.low == point:
                raise command_error(BAD_VALUE, f"cannot split on initial or final chunk's key {dict(middle)}")
            index = sharded.chunks.index(chunk)
            major, minor = sharded.version()
            upper = Chunk(point, chunk.high, chunk.shard, dict(middle), chunk.high_doc, (major, minor + 2), chunk.since)
            sharded.chunks[index] = Chunk(chunk.low, point, chunk.shard, chunk.low_doc, dict(middle), (major, minor + 1), chunk.since)
            sharded.chunks.insert(index + 1, upper)

    def chunk_of(self, ns: str, find: Mapping[str, Any]) -> Chunk:
        with self.lock:
            sharded = self._sharded(ns)
            return sharded.chunk_for(sharded.point(find))

    def move(self, ns: str, chunk: Chunk, to: str, at: Timestamp) -> None:
        """Give ``chunk`` to shard ``to`` as of cluster time ``at`` (a migration's commit, in one step
        for routing): it gets the next major version, and so does a chunk its donor keeps, as mongod's
        commit bumps the donor's shard version."""
        with self.lock:
            sharded = self._sharded(ns)
            donor = chunk.shard
            major = sharded.version()[0] + 1
            chunk.shard = self._shard(to, "moveChunk 'to'")
            chunk.version, chunk.since = (major, 0), at
            kept = next((c for c in sharded.chunks if c.shard == donor), None)
            if kept is not None:
                kept.version = (major, 1)

    def _sharded(self, ns: str) -> ShardedCollection:
        sharded = self.sharded.get(ns)
        if sharded is None:
            raise command_error(NAMESPACE_NOT_FOUND, f"collection {ns} is not sharded")
        return sharded

    def rename(self, source: str, target: str) -> None:
        with self.lock:
            if source in self.sharded:
                raise command_error(ILLEGAL_OPERATION, f"cannot rename sharded collection '{source}'")
            if source in self.placed:
                self.placed[target] = self.placed.pop(source)

    def forget(self, ns: str | None = None, db: str | None = None) -> None:
        """Drop routing of a dropped collection (or of a whole database)."""
        with self.lock:
            for table in (self.placed, self.sharded):
                for name in [n for n in table if n == ns or (db is not None and n.split(".", 1)[0] == db)]:
                    del table[name]
            if db is not None:
                self.primaries.pop(db, None)

    # -- the config database ------------------------------------------------------------------------
    def config_documents(self, collection: str) -> list[dict[str, Any]]:
        """``config.shards``, ``config.databases``, ``config.collections`` and ``config.chunks``."""
        with self.lock:
            if collection == "shards":
                return [{"_id": s, "host": self.hosts[s], "state": 1, "topologyTime": self.topology_time} for s in self.shards]
            if collection == "databases":
                return [{"_id": db, "primary": shard, "partitioned": True,
                         "version": {"uuid": Binary.from_uuid(uuid.uuid5(uuid.NAMESPACE_URL, db)),
                                     "timestamp": self.topology_time, "lastMod": 1}}
                        for db, shard in sorted(self.primaries.items())]  # fmt: skip
            if collection == "collections":
                return [{"_id": ns, "lastmodEpoch": c.epoch, "lastmod": datetime.datetime.now(datetime.UTC).replace(tzinfo=None),
                         "timestamp": self.topology_time, "uuid": Binary.from_uuid(c.uuid), "key": dict(c.key),
                         "unique": False, "noBalance": True}
                        for ns, c in sorted(self.sharded.items())]  # fmt: skip
            if collection == "chunks":
                return [{"_id": ObjectId(), "uuid": Binary.from_uuid(c.uuid), "min": chunk.low_doc, "max": chunk.high_doc,
                         "shard": chunk.shard, "lastmod": Timestamp(*chunk.version),
                         "onCurrentShardSince": chunk.since or self.topology_time,
                         "history": [{"validAfter": chunk.since or self.topology_time, "shard": chunk.shard}]}
                        for ns, c in sorted(self.sharded.items()) for chunk in c.chunks]  # fmt: skip
            return []

