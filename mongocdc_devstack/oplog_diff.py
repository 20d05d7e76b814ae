"""mongod's ``$v: 2`` update oplog diffs and the ``updateDescription`` change streams derive from them.

A diff describes how to turn the pre-image of a document into its post-image:

- document level: ``d`` (deleted fields, value ``False``), ``u`` (updated fields), ``i`` (inserted
  fields, appended at the end in order), ``s<field>`` (a diff of the sub-document or array);
- array level: ``a: true``, ``l: <new length>`` when the array was truncated, ``u<idx>: value`` and
  ``s<idx>: <sub-diff>``.

mongod logs the paths its update operators touched. The emulator only sees the documents before
and after the update, so ``compute_diff`` reconstructs the diff an operator update would most
plausibly have logged: it descends into sub-documents that kept some of their fields (``$set`` of a
nested field gives ``a.b``), reports appended array elements by index (``$push``), truncation with
``l`` (``$slice``-style updates), same-length arrays element by element (``$set`` of ``arr.1``), and
replaces an array wholesale when elements shifted (``$pull``, ``$pop`` of the first element). A field
that moved because the update reordered the document is re-inserted with ``i``, which mongod's
diff applier appends at the end, reproducing the new order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


def compute_diff(pre: Mapping[str, Any], post: Mapping[str, Any]) -> dict[str, Any]:
    """The ``$v: 2`` diff that turns ``pre`` into ``post`` (``{}`` when they are identical)."""
    return _doc_diff(pre, post)


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
    if isinstance(pre, dict) and isinstance(post, dict) and pre.keys() & post.keys():
        subdiffs[key] = _doc_diff(pre, post)
    elif isinstance(pre, list) and isinstance(post, list):
        sub = _array_diff(pre, post)
        if sub is None:
            updates[key] = post
        else:
            subdiffs[key] = sub
    else:
        updates[key] = post


def _array_diff(pre: list[Any], post: list[Any]) -> dict[str, Any] | None:
    """An array diff, or None when the array is better logged as a whole new value."""
    common = min(len(pre), len(post))
    changed = [i for i in range(common) if not strict_equal(pre[i], post[i])]
    if changed and len(pre) != len(post):
        return None  # elements shifted (e.g. $pull, $pop of the first element): mongod logs the array
    if len(pre) == len(post) and len(changed) == len(post):
        return None  # every element differs: a plain replacement
    out: dict[str, Any] = {"a": True}
    if len(post) < len(pre):
        out["l"] = len(post)
    for i in changed:
        pv, qv = pre[i], post[i]
        if isinstance(pv, dict) and isinstance(qv, dict) and pv.keys() & qv.keys():
            out[f"s{i}"] = _doc_diff(pv, qv)
        elif isinstance(pv, list) and isinstance(qv, list) and (sub := _array_diff(pv, qv)) is not None:
            out[f"s{i}"] = sub
        else:
            out[f"u{i}"] = qv
    for i in range(common, len(post)):
        out[f"u{i}"] = post[i]
    return out


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
