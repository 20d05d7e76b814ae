"""``$v: 2`` oplog diffs and the updateDescription derived from them."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mongocdc_devstack.oplog_diff import (
    _DescriptionBuilder,
    compute_diff,
    strict_equal,
    update_description,
)


def apply_diff(doc: dict[str, Any], diff: dict[str, Any]) -> dict[str, Any]:
    """mongod's diff applier: deletes, updates in place, inserts appended, sub-diffs recursed."""
    out = dict(doc)
    for name in diff.get("d", {}):
        out.pop(name, None)
    for name, value in diff.get("u", {}).items():
        out[name] = value
    for name, value in diff.get("i", {}).items():
        out.pop(name, None)
        out[name] = value
    for key, sub in diff.items():
        if key.startswith("s"):
            name = key[1:]
            out[name] = _apply_array(out[name], sub) if sub.get("a") is True else apply_diff(out[name], sub)
    return out


def _apply_array(arr: list[Any], diff: dict[str, Any]) -> list[Any]:
    out = list(arr)
    if "l" in diff:
        del out[diff["l"]:]
    for key, value in diff.items():
        if key in ("a", "l"):
            continue
        index = int(key[1:])
        while len(out) <= index:
            out.append(None)
        if key[0] == "u":
            out[index] = value
        else:
            out[index] = _apply_array(out[index], value) if value.get("a") is True else apply_diff(out[index], value)
    return out


def apply_description(doc: dict[str, Any], desc: dict[str, Any]) -> dict[str, Any]:
    """Apply updateDescription like a consumer would: truncate, unset, then set dotted paths."""
    out = copy.deepcopy(doc)

    def walk(path: str) -> tuple[Any, str | int]:
        parts = path.split(".")
        node: Any = out
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        last = parts[-1]
        return node, int(last) if isinstance(node, list) else last

    for item in desc["truncatedArrays"]:
        node, key = walk(item["field"])
        del node[key][item["newSize"]:]
    for path in desc["removedFields"]:
        node, key = walk(path)
        del node[key]
    for path, value in desc["updatedFields"].items():
        node, key = walk(path)
        if isinstance(node, list) and isinstance(key, int):
            while len(node) <= key:
                node.append(None)
        node[key] = value
    return out


def test_set_nested_field() -> None:
    pre = {"_id": 1, "a": {"b": 1, "c": 1}}
    diff = compute_diff(pre, {"_id": 1, "a": {"b": 2, "c": 1}})
    assert diff == {"sa": {"u": {"b": 2}}}
    assert update_description(diff) == {"updatedFields": {"a.b": 2}, "removedFields": [], "truncatedArrays": []}


def test_unset_and_new_field() -> None:
    diff = compute_diff({"_id": 1, "x": 1, "y": 2}, {"_id": 1, "y": 2, "z": 3})
    assert diff == {"d": {"x": False}, "i": {"z": 3}}
    desc = update_description(diff)
    assert desc["updatedFields"] == {"z": 3} and desc["removedFields"] == ["x"]


def test_inc_changes_the_type_when_the_value_type_changes() -> None:
    assert compute_diff({"n": 1}, {"n": 2}) == {"u": {"n": 2}}
    assert compute_diff({"n": 1}, {"n": 1.0}) == {"u": {"n": 1.0}}  # binary inequality, as in mongod


def test_push_appends_by_index() -> None:
    diff = compute_diff({"arr": [1, 2]}, {"arr": [1, 2, 3]})
    assert diff == {"sarr": {"a": True, "u2": 3}}
    assert update_description(diff)["updatedFields"] == {"arr.2": 3}


def test_truncation_reports_truncated_arrays() -> None:
    diff = compute_diff({"arr": [1, 2, 3]}, {"arr": [1, 2]})
    assert diff == {"sarr": {"a": True, "l": 2}}
    assert update_description(diff)["truncatedArrays"] == [{"field": "arr", "newSize": 2}]


def test_replacing_an_array_element() -> None:
    diff = compute_diff({"arr": [1, {"k": 1, "j": 0}, 3]}, {"arr": [1, {"k": 2, "j": 0}, 3]})
    assert diff == {"sarr": {"a": True, "s1": {"u": {"k": 2}}}}
    assert update_description(diff)["updatedFields"] == {"arr.1.k": 2}
    assert update_description(compute_diff({"arr": [1, 2]}, {"arr": [1, 5]}))["updatedFields"] == {"arr.1": 5}


def test_shifted_array_is_logged_whole() -> None:
    assert compute_diff({"arr": [1, 2, 3]}, {"arr": [2, 3]}) == {"u": {"arr": [2, 3]}}


def test_field_order_change_reinserts_moved_fields() -> None:
    pre = {"_id": 1, "a": 1, "b": 2}
    post = {"_id": 1, "b": 2, "a": 1}
    diff = compute_diff(pre, post)
    assert diff == {"i": {"a": 1}}
    assert list(apply_diff(pre, diff)) == ["_id", "b", "a"]


def test_disambiguated_paths_only_with_expanded_events() -> None:
    diff = compute_diff({"a": {"0": {"x": 1}}, "arr": [[1], [2, 0]]}, {"a": {"0": {"x": 2}}, "arr": [[1], [3, 0]]})
    plain = update_description(diff)
    assert "disambiguatedPaths" not in plain
    expanded = update_description(diff, show_expanded_events=True)
    assert expanded["updatedFields"] == {"a.0.x": 2, "arr.1.0": 3}
    assert expanded["disambiguatedPaths"] == {"a.0.x": ["a", "0", "x"]}
    dotted = update_description(compute_diff({"a.b": 1}, {"a.b": 2}), show_expanded_events=True)
    assert dotted["disambiguatedPaths"] == {"a.b": ["a.b"]}
    assert update_description({}, show_expanded_events=True)["disambiguatedPaths"] == {}


def test_identical_documents_give_an_empty_diff() -> None:
    doc = {"_id": 1, "a": [1, {"b": None}], "c": {"d": 1.5}}
    assert compute_diff(doc, copy.deepcopy(doc)) == {}


_names = st.sampled_from(["a", "b", "c", "d", "e"])
_leaf = st.one_of(st.integers(-5, 5), st.text("xy", max_size=2), st.none(), st.booleans(), st.floats(-2, 2))
_value = st.recursive(
    _leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_names, inner, max_size=4)),
    max_leaves=10,
)
_doc = st.dictionaries(_names, _value, max_size=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # timing is not what is tested
@given(_doc, _doc)
def test_diff_applied_to_pre_gives_post_exactly(pre: dict[str, Any], post: dict[str, Any]) -> None:
    diff = compute_diff(pre, post)
    result = apply_diff(pre, diff)
    assert strict_equal(result, post), (pre, post, diff, result)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # timing is not what is tested
@given(_doc, _doc)
def test_update_description_applied_to_pre_gives_post(pre: dict[str, Any], post: dict[str, Any]) -> None:
    """Up to the order of fields, which the description cannot express (mongod's neither)."""
    desc = update_description(compute_diff(pre, post))
    result = apply_description(pre, desc)
    assert _unordered(result) == _unordered(post)


def _unordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unordered(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unordered(v) for v in value]
    return (type(value).__name__, value)


_FLAT_NAMES = st.sampled_from(["a", "b", "a.b", "0", "x1", "1", ""])
_FLAT_SECTION = st.dictionaries(_FLAT_NAMES, st.one_of(st.integers(), st.text(max_size=3), st.none()), max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # timing is not what is tested
@given(diff=st.dictionaries(st.sampled_from(["u", "i", "d"]), _FLAT_SECTION, max_size=3), expanded=st.booleans())
def test_flat_diff_shortcut_equals_the_general_walk(diff: dict[str, Any], expanded: bool) -> None:
    """Top-level-only diffs skip the path walker; the result, key order included, must not change."""
    builder = _DescriptionBuilder()
    builder.document(diff)
    expected: dict[str, Any] = {
        "updatedFields": builder.updated, "removedFields": builder.removed, "truncatedArrays": builder.truncated,
    }  # fmt: skip
    if expanded:
        expected["disambiguatedPaths"] = builder.disambiguated
    got = update_description(diff, expanded)
    assert got == expected
    assert list(got["updatedFields"]) == list(expected["updatedFields"])
    assert list(got) == list(expected)
