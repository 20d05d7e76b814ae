"""``field.exclude.list``, ``field.renames`` and ``field.name.adjustment.mode`` on document fields.

Rules are ``<db>.<collection>.<field>[.<nested>...]`` (``:<newName>`` for renames) where the
database and collection parts may use ``*`` for any characters. They apply to full documents
(``before``/``after``, nested documents and documents inside arrays), to ``updatedFields`` and to
``removedFields``/``truncatedArrays`` paths, whose dotted names may carry array indexes
(``items.0.price``); numeric path segments are skipped when matching. Documents are copied only
along the paths that change.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

from mongocdc_core.events.schema import adjust_field_name


@dataclass(frozen=True, slots=True)
class FieldRule:
    """One parsed exclusion (``new_name`` None) or rename rule."""

    db: re.Pattern[str]
    rest: str
    new_name: str | None
    source: str

    def path_for(self, db: str, coll: str) -> tuple[str, ...] | None:
        """The field path this rule targets in ``db.coll``, or None when it does not apply."""
        if not self.db.fullmatch(db):
            return None
        segments = self.rest.split(".")
        for i in range(1, len(segments)):
            if _wildcard(".".join(segments[:i])).fullmatch(coll):
                return tuple(segments[i:])
        return None


@lru_cache(maxsize=1024)
def _wildcard(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(p) for p in pattern.split("*")))


def parse_rules(excludes: Iterable[str], renames: Iterable[str]) -> list[FieldRule]:
    """Parse the two properties; exclusions first, then renames in the order given."""
    rules = []
    for prop, entries, is_rename in (
        ("field.exclude.list", excludes, False),
        ("field.renames", renames, True),
    ):
        for raw in entries:
            entry = raw.strip()
            new_name = None
            spec = entry
            if is_rename:
                spec, sep, new_name = entry.rpartition(":")
                if not sep or not new_name or "." in new_name:
                    raise ValueError(
                        f"{prop} entry {raw!r} must look like <db>.<collection>.<field path>:<new name>"
                    )
            db, dot, rest = spec.partition(".")
            if not db or not dot or rest.count(".") < 1 or "" in rest.split("."):
                raise ValueError(f"{prop} entry {raw!r} must look like <db>.<collection>.<field path>")
            rules.append(FieldRule(_wildcard(db), rest, new_name, raw))
    return rules


def _map_nested(value: Any, fn: Callable[[Mapping[str, Any]], Mapping[str, Any]]) -> Any:
    """Apply ``fn`` to a document, or to every document inside (nested) arrays; keep identity if unchanged."""
    if isinstance(value, Mapping):
        return fn(value)
    if isinstance(value, list):
        items = [_map_nested(v, fn) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    return value


def _exclude(doc: Mapping[str, Any], path: Sequence[str]) -> Mapping[str, Any]:
    head = path[0]
    if head not in doc:
        return doc
    if len(path) == 1:
        return {k: v for k, v in doc.items() if k != head}
    child = doc[head]
    new_child = _map_nested(child, lambda d: _exclude(d, path[1:]))
    if new_child is child:
        return doc
    return {**doc, head: new_child}


def _rename(doc: Mapping[str, Any], path: Sequence[str], new_name: str, last: bool = False) -> Mapping[str, Any]:
    """Rename in place, or (``last``, as Debezium's remove-then-put does) as the document's last field."""
    head = path[0]
    if head not in doc:
        return doc
    if len(path) == 1:
        if last:
            renamed = {k: v for k, v in doc.items() if k != head}
            renamed[new_name] = doc[head]
            return renamed
        return {(new_name if k == head else k): v for k, v in doc.items()}
    child = doc[head]
    new_child = _map_nested(child, lambda d: _rename(d, path[1:], new_name, last))
    if new_child is child:
        return doc
    return {**doc, head: new_child}


def _adjust_names(doc: Mapping[str, Any], mode: str) -> Mapping[str, Any]:
    return {
        adjust_field_name(k, mode): _map_nested(v, lambda d: _adjust_names(d, mode)) for k, v in doc.items()
    }


def _rewrite_inside(value: Any, path: Sequence[str], new_name: str | None, last: bool = False) -> Any:
    """Exclude (``new_name`` None) or rename ``path`` inside a value that is a document or array."""
    if new_name is None:
        return _map_nested(value, lambda d: _exclude(d, path))
    return _map_nested(value, lambda d: _rename(d, path, new_name, last))


def _named_positions(segments: Sequence[str]) -> list[int]:
    """Indexes of the non-numeric segments of a dotted update path (numeric ones are array indexes)."""
    return [i for i, s in enumerate(segments) if not s.isdigit()]


class CollectionFields:
    """The rules that apply to one collection, as ready-to-run path operations.

    ``renamed_last``: a renamed field becomes the last of its document (and of ``updatedFields``),
    as the Debezium 3.x connector writes it; otherwise it keeps its place.
    """

    __slots__ = ("_ops", "_name_mode", "_renamed_last")

    def __init__(
        self, ops: list[tuple[tuple[str, ...], str | None]], name_mode: str, renamed_last: bool = False
    ) -> None:
        self._ops = ops
        self._name_mode = name_mode
        self._renamed_last = renamed_last

    @property
    def renamed_last(self) -> bool:
        return self._renamed_last

    def document(self, doc: Mapping[str, Any]) -> Mapping[str, Any]:
        """A full document (before/after/read) with the rules applied."""
        for path, new_name in self._ops:
            doc = _exclude(doc, path) if new_name is None else _rename(doc, path, new_name, self._renamed_last)
        if self._name_mode != "none":
            doc = _adjust_names(doc, self._name_mode)
        return doc

    def compiled_rules(self) -> list[tuple[list[str], str | None]] | None:
        """The rules as the compiled module applies them while it writes a whole document (see
        ``native/src/rules.rs``), or None where their result depends on the order they apply in:
        a field name adjustment, a rule on or inside a name another rule renames to, a rename
        inside a renamed field, a path renamed twice or two paths renamed to one."""
        if self._name_mode != "none":
            return None
        renames = [(path, new_name) for path, new_name in self._ops if new_name is not None]
        targets = {path[:-1] + (new_name,) for path, new_name in renames}
        if len(targets) < len(renames) or len({path for path, _ in renames}) < len(renames):
            return None
        for path, new_name in self._ops:
            if any(path[: len(target)] == target for target in targets):
                return None
            if new_name is not None and any(
                other_name is not None and len(other) > len(path) and other[: len(path)] == path
                for other, other_name in self._ops
            ):
                return None
        return [(list(path), new_name) for path, new_name in self._ops]

    def _path(self, dotted: str) -> tuple[str | None, Callable[[Any], Any] | None, int]:
        """Rewrite one dotted update path; returns (new path or None if excluded, value rewriter,
        index of the last rule that renamed the path itself, -1 for none)."""
        segments = dotted.split(".")
        value_fns: list[Callable[[Any], Any]] = []
        renamed_by = -1
        for index, (path, new_name) in enumerate(self._ops):
            named = _named_positions(segments)
            names = [segments[i] for i in named]
            if len(path) <= len(names) and tuple(names[: len(path)]) == path:
                if new_name is None:
                    return None, None, -1
                segments[named[len(path) - 1]] = new_name
                renamed_by = index
            elif tuple(path[: len(names)]) == tuple(names):
                inner = path[len(names) :]
                value_fns.append(partial(_rewrite_inside, path=inner, new_name=new_name, last=self._renamed_last))
        if self._name_mode != "none":
            segments = [s if s.isdigit() else adjust_field_name(s, self._name_mode) for s in segments]
            mode = self._name_mode
            value_fns.append(lambda v: _map_nested(v, lambda d: _adjust_names(d, mode)))

        def rewrite(value: Any) -> Any:
            for fn in value_fns:
                value = fn(value)
            return value

        return ".".join(segments), rewrite if value_fns else None, renamed_by

    def updated_fields(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        """``updateDescription.updatedFields`` (dotted names) with the rules applied."""
        out: dict[str, Any] = {}
        renamed: list[tuple[int, str, Any]] = []
        for name, value in fields.items():
            new_name, rewrite, renamed_by = self._path(name)
            if new_name is not None:
                new_value = rewrite(value) if rewrite is not None else value
                if self._renamed_last and renamed_by >= 0:
                    renamed.append((renamed_by, new_name, new_value))
                else:
                    out[new_name] = new_value
        for _, new_name, new_value in sorted(renamed, key=lambda entry: entry[0]):  # rule by rule, as applied
            out[new_name] = new_value
        return out

    def field_paths(self, names: Iterable[str]) -> list[str]:
        """``removedFields``-style dotted paths with the rules applied (excluded ones dropped)."""
        out = []
        for name in names:
            new_name, _, _ = self._path(name)
            if new_name is not None:
                out.append(new_name)
        return out


class FieldTransforms:
    """All field rules of a connector, resolved and cached per collection."""

    def __init__(
        self,
        excludes: Iterable[str],
        renames: Iterable[str],
        field_name_mode: str = "none",
        *,
        renamed_last: bool = False,
    ) -> None:
        self._rules = parse_rules(excludes, renames)
        self._name_mode = field_name_mode
        self._renamed_last = renamed_last
        self._cache: dict[tuple[str, str], CollectionFields | None] = {}

    def for_collection(self, db: str, coll: str) -> CollectionFields | None:
        """The transform for ``db.coll``, or None when no rule and no name adjustment applies."""
        key = (db, coll)
        try:
            return self._cache[key]
        except KeyError:
            pass
        ops = []
        for rule in self._rules:
            path = rule.path_for(db, coll)
            if path is not None:
                ops.append((path, rule.new_name))
        result = (
            CollectionFields(ops, self._name_mode, self._renamed_last) if ops or self._name_mode != "none" else None
        )
        self._cache[key] = result
        return result
