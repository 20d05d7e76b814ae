"""Which databases and collections a connector captures and snapshots (Debezium's filter rules).

Kept apart from :class:`~mongocdc_core.config.ConnectorConfig` so the validators can ask the same
question ("would this collection be captured?") before the config exists.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mongocdc_core.config.specs import BUILT_IN_DATABASES

_FILTER_LISTS = ("database.include.list", "database.exclude.list", "collection.include.list",
                 "collection.exclude.list")


@dataclass(frozen=True)
class CollectionFilters:
    """The include/exclude lists, capture scope and signaling collection, compiled once."""

    regex_mode: bool
    lists: Mapping[str, tuple[str, ...]]
    capture_scope: str
    capture_target: str | None
    signal_data_collection: str | None
    _patterns: dict[str, tuple[re.Pattern[str], ...]] = field(init=False, repr=False, compare=False)
    _literals: dict[str, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        patterns = {"snapshot.include.collection.list": self._compile("snapshot.include.collection.list")}
        if self.regex_mode:
            patterns.update({prop: self._compile(prop) for prop in _FILTER_LISTS})
        object.__setattr__(self, "_patterns", patterns)
        object.__setattr__(self, "_literals", {
            prop: frozenset(item.lower() for item in self.lists.get(prop, ())) for prop in _FILTER_LISTS
        })

    def _compile(self, prop: str) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p, re.IGNORECASE) for p in self.lists.get(prop, ()))

    def _matches(self, prop: str, name: str) -> bool:
        if prop in self._patterns:
            return any(p.fullmatch(name) for p in self._patterns[prop])
        return name.lower() in self._literals[prop]

    def is_signal_collection(self, db: str, collection: str) -> bool:
        """Whether `db.collection` is the configured signaling collection."""
        return self.signal_data_collection == f"{db}.{collection}"

    def database_included(self, db: str) -> bool:
        """Whether changes in database `db` are captured (filters, capture scope, built-in databases).

        The database of the signaling collection is always included so signals are seen.
        """
        signal = self.signal_data_collection
        return (signal is not None and signal.split(".", 1)[0] == db) or self.database_captured(db)

    def collection_included(self, db: str, collection: str) -> bool:
        """Whether changes in `db.collection` are captured; the signaling collection always is.

        Regex mode matches each pattern against the whole `<db>.<collection>` (anchored); literal mode
        compares whole names. Both ignore case, as Debezium does. System collections (`system.*`) and the
        admin, config and local databases are never captured.
        """
        return self.is_signal_collection(db, collection) or self.collection_captured(db, collection)

    def snapshot_collection_included(self, db: str, collection: str) -> bool:
        """Whether an initial or blocking snapshot copies `db.collection`.

        It must be captured by the filters (the signaling collection only counts if the filters capture
        it) and match snapshot.include.collection.list when that is set.
        """
        if not self.collection_captured(db, collection):
            return False
        if self.lists.get("snapshot.include.collection.list"):
            return self._matches("snapshot.include.collection.list", f"{db}.{collection}")
        return True

    def database_captured(self, db: str) -> bool:
        """Whether the filters and the capture scope capture database `db` (signals aside)."""
        if db in BUILT_IN_DATABASES:
            return False
        if self.capture_scope == "database" and db != self.capture_target:
            return False
        if self.capture_scope == "collection" and db != (self.capture_target or "").split(".", 1)[0]:
            return False
        if self.lists.get("database.include.list"):
            return self._matches("database.include.list", db)
        if self.lists.get("database.exclude.list"):
            return not self._matches("database.exclude.list", db)
        return True

    def collection_captured(self, db: str, collection: str) -> bool:
        """Whether the filters and the capture scope capture `db.collection` (signals aside)."""
        if collection.startswith("system.") or not self.database_captured(db):
            return False
        namespace = f"{db}.{collection}"
        if self.capture_scope == "collection" and namespace != self.capture_target:
            return False
        if self.lists.get("collection.include.list"):
            return self._matches("collection.include.list", namespace)
        if self.lists.get("collection.exclude.list"):
            return not self._matches("collection.exclude.list", namespace)
        return True


def matches_any(namespace: str, patterns: Sequence[str]) -> bool:
    """Whether ``'<db>.<collection>'`` is chosen by the commands' ``--collection`` patterns (shell wildcards,
    case-sensitive on every platform, as MongoDB's names are); no pattern chooses every collection."""
    return not patterns or any(fnmatch.fnmatchcase(namespace, pattern) for pattern in patterns)
