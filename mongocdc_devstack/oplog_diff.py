"""mongod's ``$v: 2`` update oplog diffs and the ``updateDescription`` change streams derive from them.

A diff describes how to turn the pre-image of a document into its post-image:

- document level: ``d`` (deleted fields, value ``False``), ``u`` (updated fields), ``i`` (inserted
  fields, appended at the end in order), ``s<field>`` (a diff of the sub-document or array);
- array level: ``a: true``, ``l: <new length>`` when the array was truncated, ``u<idx>: value`` and
  ``s<idx>: <sub-diff>``.

Two sources, as in mongod:

- an operator update (``$set``, ``$unset``, ``$push`` ...) logs what each modifier did
  (``UpdateLog``, fed by ``matching.apply_update_with_diff``): a ``$set`` of a whole sub-document is
  that one field, ``$push`` appends logged by index, other array modifiers (``$pop``, ``$pull``,
  ``$addToSet``) log the whole new array, ``$unset`` a deletion, ``$rename`` a deletion plus a
  creation, new fields an insertion of the first new path component;
- a pipeline update is logged as the difference of the two documents (``compute_diff``, mongod's
  ``doc_diff::computeOplogDiff``): field by field, arrays element by element with a resize
  (``l``) when they got shorter; a sub-diff larger than the new value is replaced by the value,
  and when the whole diff is larger than the new document mongod logs a replacement instead
  (``compute_diff`` then returns None).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import bson


def strict_equal(a: Any, b: Any) -> bool:
    """BSON binary equality: same types, same values, same field order (``1 != 1.0`` here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        if len(a) != len(b):
            return False
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
            if ka != kb or not strict_equal(va, vb):
                return False
        return True
    if isinstance(a, list):
        return len(a) == len(b) and all(strict_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    return bool(a == b)


def compute_diff(pre: Mapping[str, Any], post: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``$v: 2`` diff that turns ``pre`` into ``post`` (``{}`` when they are identical), or None
    when it is larger than ``post`` itself: mongod then logs the update as a replacement."""
    diff = _doc_diff(pre, post)
    if diff and _size(diff) + _DELTA_ENTRY_OVERHEAD > _size(post):
        return None
    return diff


_DELTA_ENTRY_OVERHEAD = 15  # mongod's kSizeOfDeltaOplogEntryMetadata: the "$v: 2, diff:" around it


def _size(value: Mapping[str, Any]) -> int:
    return len(bson.encode(value))


def _smaller_than(diff: Mapping[str, Any], value: Any) -> bool:
    """Whether a sub-diff is worth logging instead of the whole new value."""
    return _size(diff) < _size({"v": value})


def _doc_diff(pre: Mapping[str, Any], post: Mapping[str, Any]) -> dict[str, Any]:
    updates: dict[str, Any] = {}
    inserts: dict[str, Any] = {}
    subdiffs: dict[str, Any] = {}
    deletes: dict[str, bool] = {}
    pre_items = list(pre.items())
    post_items = list(post.items())
    pi = qi = 0
    # Walk both documents in order: matching names are compared, a pre field whose name does not
    # match the next post field is (provisionally) deleted, and leftover post fields are inserted.
    while pi < len(pre_items) and qi < len(post_items):
        pk, pv = pre_items[pi]
        qk, qv = post_items[qi]
        if pk == qk:
            _value_diff(pk, pv, qv, updates, subdiffs)
            qi += 1
        else:
            deletes[pk] = False
        pi += 1
    for pk, _ in pre_items[pi:]:
        deletes[pk] = False
    for qk, qv in post_items[qi:]:
        deletes.pop(qk, None)
        inserts[qk] = qv
    out: dict[str, Any] = {}
    if deletes:
        out["d"] = deletes
    if updates:
        out["u"] = updates
    if inserts:
        out["i"] = inserts
    for name, sub in subdiffs.items():
        out["s" + name] = sub
    return out


def _value_diff(key: str, pre: Any, post: Any, updates: dict[str, Any], subdiffs: dict[str, Any]) -> None:
    if strict_equal(pre, post):
        return
    sub = _sub_diff(pre, post)
    if sub is None:
        updates[key] = post
    else:
        subdiffs[key] = sub


def _sub_diff(pre: Any, post: Any) -> dict[str, Any] | None:
    """mongod's ``calculateSubDiffForValue``: two documents or two arrays get a sub-diff unless it
    is larger than the new value."""
    if isinstance(pre, dict) and isinstance(post, dict):
        sub = _doc_diff(pre, post)
    elif isinstance(pre, list) and isinstance(post, list):
        sub = _array_diff(pre, post)
    else:
        return None
    return sub if _smaller_than(sub, post) else None


def _array_diff(pre: list[Any], post: list[Any]) -> dict[str, Any]:
    """mongod's ``computeArrayDiff``: element by element, appended elements by index, and a resize
    (``l``) when the array got shorter."""
    out: dict[str, Any] = {"a": True}
    common = min(len(pre), len(post))
    if len(post) < len(pre):
        out["l"] = len(post)
    for i in range(common):
        pv, qv = pre[i], post[i]
        if strict_equal(pv, qv):
            continue
        sub = _sub_diff(pv, qv)
        if sub is None:
            out[f"u{i}"] = qv
        else:
            out[f"s{i}"] = sub
    for i in range(common, len(post)):
        out[f"u{i}"] = post[i]
    return out


# -- diffs logged by operator updates -------------------------------------------------------------


class UpdateLog:
    """What the modifiers of one operator update did, as mongod's v2 log builder records it.

    Paths are lists of components (field names, or array indexes as digit strings); values are
    read from the final document when the diff is built, so later modifiers under a created or
    replaced field are part of its logged value, as in mongod.
    """

    def __init__(self) -> None:
        self.entries: list[tuple[str, list[str]]] = []  # ("update" | "create" | "delete", path)

    def updated(self, path: list[str]) -> None:
        self.entries.append(("update", list(path)))

    def created(self, path: list[str]) -> None:
        """``path`` ends at the first component that did not exist before."""
        self.entries.append(("create", list(path)))

    def deleted(self, path: list[str]) -> None:
        self.entries.append(("delete", list(path)))

    def diff(self, post: Mapping[str, Any]) -> dict[str, Any]:
        root = _LogNode(array=False)
        logged: set[tuple[str, ...]] = set()
        for kind, path in self.entries:
            if any(tuple(path[:n]) in logged for n in range(1, len(path) + 1)):
                continue  # inside a field already logged whole: its final value covers this
            node, container = root, post
            for part in path[:-1]:
                container = container[int(part)] if isinstance(container, list) else container[part]
                node = node.child(part, isinstance(container, list))
            last = path[-1]
            if kind == "delete":
                node.deletes[last] = False
            else:
                value = container[int(last)] if isinstance(container, list) else container[last]
                if node.array or kind == "update":
                    node.updates[last] = value
                else:
                    node.inserts[last] = value
            logged.add(tuple(path))
        return root.serialize()


class _LogNode:
    __slots__ = ("array", "deletes", "updates", "inserts", "children")

    def __init__(self, array: bool) -> None:
        self.array = array
        self.deletes: dict[str, bool] = {}
        self.updates: dict[str, Any] = {}
        self.inserts: dict[str, Any] = {}
        self.children: dict[str, _LogNode] = {}

    def child(self, name: str, array: bool) -> _LogNode:
        found = self.children.get(name)
        if found is None:
            found = self.children[name] = _LogNode(array)
        return found

    def serialize(self) -> dict[str, Any]:
        if self.array:
            out: dict[str, Any] = {"a": True}
            entries = [(int(i), f"u{i}", v) for i, v in self.updates.items()]
            entries += [(int(i), f"s{i}", c.serialize()) for i, c in self.children.items()]
            for _, key, value in sorted(entries, key=lambda entry: entry[0]):
                out[key] = value
            return out
        doc: dict[str, Any] = {}
        if self.deletes:
            doc["d"] = dict(self.deletes)
        if self.updates:
            doc["u"] = dict(self.updates)
        if self.inserts:
            doc["i"] = dict(self.inserts)
        for name, node in self.children.items():
            doc["s" + name] = node.serialize()
        return doc


# -- updateDescription ---------------------------------------------------------------------------


def _is_numeric_component(part: str) -> bool:
    """mongod's ``FieldRef::isNumericPathComponentStrict``: digits without a leading zero."""
    return part.isdigit() and part.isascii() and (part == "0" or part[0] != "0")


class _DescriptionBuilder:
    """Walks a diff the way mongod's ``change_stream_document_diff_parser`` does."""

    def __init__(self) -> None:
        self.updated: dict[str, Any] = {}
        self.removed: list[str] = []
        self.truncated: list[dict[str, Any]] = []
        self.disambiguated: dict[str, list[Any]] = {}
        self.parts: list[str | int] = []
        self.ambiguous: list[bool] = []

    def push(self, part: str | int) -> None:
        if self.ambiguous and self.ambiguous[-1]:
            self.ambiguous.append(True)
        elif isinstance(part, int):
            self.ambiguous.append(False)
        else:
            numeric = bool(self.parts) and _is_numeric_component(part)
            self.ambiguous.append(numeric or "." in part)
        self.parts.append(part)

    def pop(self) -> None:
        self.parts.pop()
        self.ambiguous.pop()

    def path(self) -> str:
        return ".".join(str(p) for p in self.parts)

    def note(self) -> str:
        dotted = self.path()
        if self.ambiguous and self.ambiguous[-1]:
            self.disambiguated[dotted] = list(self.parts)
        return dotted

    def leaf(self, part: str | int) -> str:
        self.push(part)
        try:
            return self.note()
        finally:
            self.pop()

    def document(self, diff: Mapping[str, Any]) -> None:
        for section in ("u", "i"):
            for name, value in diff.get(section, {}).items():
                self.updated[self.leaf(name)] = value
        for name in diff.get("d", {}):
            self.removed.append(self.leaf(name))
        for key, sub in diff.items():
            if key.startswith("s") and isinstance(sub, Mapping):
                self.push(key[1:])
                if sub.get("a") is True:
                    self.array(sub)
                else:
                    self.document(sub)
                self.pop()

    def array(self, diff: Mapping[str, Any]) -> None:
        if "l" in diff:
            self.truncated.append({"field": self.note(), "newSize": int(diff["l"])})
        for key, value in diff.items():
            if key in ("a", "l"):
                continue
            kind, index = key[0], int(key[1:])
            if kind == "u":
                self.updated[self.leaf(index)] = value
            elif kind == "s":
                self.push(index)
                if value.get("a") is True:
                    self.array(value)
                else:
                    self.document(value)
                self.pop()
            else:
                raise ValueError(f"unknown array diff entry {key!r}")


def update_description(diff: Mapping[str, Any], show_expanded_events: bool = False) -> dict[str, Any]:
    """The change event's ``updateDescription`` for a ``$v: 2`` diff, field order as mongod's."""
    if _is_flat(diff):
        # Top-level fields only (the common ``$set``/``$unset`` of plain fields): paths are the names.
        updated = dict(diff.get("u", ()))
        updated.update(diff.get("i", ()))
        out: dict[str, Any] = {"updatedFields": updated, "removedFields": list(diff.get("d", ())), "truncatedArrays": []}
        if show_expanded_events:
            out["disambiguatedPaths"] = {}
        return out
    builder = _DescriptionBuilder()
    builder.document(diff)
    out = {
        "updatedFields": builder.updated,
        "removedFields": builder.removed,
        "truncatedArrays": builder.truncated,
    }
    if show_expanded_events:
        out["disambiguatedPaths"] = builder.disambiguated
    return out


def _is_flat(diff: Mapping[str, Any]) -> bool:
    """A diff of top-level fields whose names need no disambiguation (no dots)."""
    for section, fields in diff.items():
        if section not in ("u", "i", "d") or not isinstance(fields, Mapping):
            return False
        for name in fields:
            if "." in name:
                return False
    return True
