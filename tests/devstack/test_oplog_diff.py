"""``$v: 2`` oplog diffs and the updateDescription derived from them."""

from __future__ import annotations

import copy
from typing import Any

import bson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mongocdc_devstack.matching import apply_update_with_diff
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


PAD = "p" * 64  # a document large enough that its diff is smaller than the document, as real ones are


def test_set_nested_field() -> None:
    pre = {"_id": 1, "a": {"b": 1, "c": 1}, "pad": PAD}
    diff = compute_diff(pre, {"_id": 1, "a": {"b": 2, "c": 1}, "pad": PAD})
    assert diff == {"sa": {"u": {"b": 2}}}
    assert update_description(diff) == {"updatedFields": {"a.b": 2}, "removedFields": [], "truncatedArrays": []}


def test_unset_and_new_field() -> None:
    diff = compute_diff({"_id": 1, "x": 1, "y": 2, "pad": PAD}, {"_id": 1, "y": 2, "pad": PAD, "z": 3})
    assert diff == {"d": {"x": False}, "i": {"z": 3}}
    desc = update_description(diff)
    assert desc["updatedFields"] == {"z": 3} and desc["removedFields"] == ["x"]


def test_binary_inequality_decides_not_numeric_equality() -> None:
    assert compute_diff({"n": 1, "pad": PAD}, {"n": 2, "pad": PAD}) == {"u": {"n": 2}}
    assert compute_diff({"n": 1, "pad": PAD}, {"n": 1.0, "pad": PAD}) == {"u": {"n": 1.0}}  # as in mongod


def test_a_diff_larger_than_the_document_is_a_replacement() -> None:
    """mongod logs a pipeline update whose diff outweighs the new document as a replacement."""
    assert compute_diff({"n": 1}, {"n": 2}) is None
    assert compute_diff({"_id": 1, "n": 1}, {"_id": 1, "n": 1}) == {}


def test_appended_elements_by_index() -> None:
    diff = compute_diff({"arr": [1, 2], "pad": PAD}, {"arr": [1, 2, 3], "pad": PAD})
    assert diff == {"sarr": {"a": True, "u2": 3}}
    assert update_description(diff)["updatedFields"] == {"arr.2": 3}


def test_truncation_reports_truncated_arrays() -> None:
    diff = compute_diff({"arr": [1, 2, 3], "pad": PAD}, {"arr": [1, 2], "pad": PAD})
    assert diff == {"sarr": {"a": True, "l": 2}}
    assert update_description(diff)["truncatedArrays"] == [{"field": "arr", "newSize": 2}]


def test_replacing_an_array_element() -> None:
    pre = {"arr": [1, {"k": 1, "j": 0, "text": "some longer text"}, 3], "pad": PAD}
    diff = compute_diff(pre, {"arr": [1, {"k": 2, "j": 0, "text": "some longer text"}, 3], "pad": PAD})
    assert diff == {"sarr": {"a": True, "s1": {"u": {"k": 2}}}}
    assert update_description(diff)["updatedFields"] == {"arr.1.k": 2}
    assert update_description(compute_diff({"arr": [1, 2], "pad": PAD}, {"arr": [1, 5], "pad": PAD}))["updatedFields"] == {"arr.1": 5}


def test_shifted_array_is_compared_element_by_element_unless_the_whole_is_smaller() -> None:
    long = [f"element {i}" for i in range(6)]
    diff = compute_diff({"arr": long, "pad": PAD}, {"arr": long[1:], "pad": PAD})
    assert diff == {"sarr": {"a": True, "l": 5, **{f"u{i}": long[i + 1] for i in range(5)}}} or diff == {"u": {"arr": long[1:]}}
    assert compute_diff({"arr": [1, 2, 3], "pad": PAD}, {"arr": [2, 3], "pad": PAD}) == {"u": {"arr": [2, 3]}}


def test_field_order_change_reinserts_moved_fields() -> None:
    pre = {"_id": 1, "a": 1, "b": 2, "pad": PAD}
    post = {"_id": 1, "b": 2, "pad": PAD, "a": 1}
    diff = compute_diff(pre, post)
    assert diff == {"i": {"a": 1}}
    assert list(apply_diff(pre, diff)) == ["_id", "b", "pad", "a"]


def test_disambiguated_paths_only_with_expanded_events() -> None:
    diff = {"sa": {"s0": {"u": {"x": 2}}}, "sarr": {"a": True, "s1": {"a": True, "u0": 3}}}
    plain = update_description(diff)
    assert "disambiguatedPaths" not in plain
    expanded = update_description(diff, show_expanded_events=True)
    assert expanded["updatedFields"] == {"a.0.x": 2, "arr.1.0": 3}
    assert expanded["disambiguatedPaths"] == {"a.0.x": ["a", "0", "x"]}
    dotted = update_description({"u": {"a.b": 2}}, show_expanded_events=True)
    assert dotted["disambiguatedPaths"] == {"a.b": ["a.b"]}
    assert update_description({}, show_expanded_events=True)["disambiguatedPaths"] == {}


def test_identical_documents_give_an_empty_diff() -> None:
    doc = {"_id": 1, "a": [1, {"b": None}], "c": {"d": 1.5}}
    assert compute_diff(doc, copy.deepcopy(doc)) == {}


# -- diffs logged by operator updates (what mongod's modifiers log, not a comparison) --------------

DOC = {"_id": 1, "a": {"b": 1, "c": {"d": 1}}, "arr": [1, 2, 3], "objs": [{"x": 1}, {"x": 2}], "n": 5}


def logged(update: dict[str, Any], doc: dict[str, Any] | None = None, **options: Any) -> dict[str, Any] | None:
    return apply_update_with_diff(doc or DOC, update, **options)[1]


def test_set_of_a_whole_subdocument_is_that_field() -> None:
    assert logged({"$set": {"a": {"b": 1, "c": {"d": 2}}}}) == {"u": {"a": {"b": 1, "c": {"d": 2}}}}
    assert logged({"$set": {"a.c.d": 2}}) == {"sa": {"sc": {"u": {"d": 2}}}}


def test_new_paths_insert_their_first_new_component() -> None:
    assert logged({"$set": {"a.e.f": 1}}) == {"sa": {"i": {"e": {"f": 1}}}}
    assert logged({"$set": {"z": 1, "y": 2}}) == {"i": {"y": 2, "z": 1}}  # applied in field order, as mongod
    assert list(apply_update_with_diff(DOC, {"$set": {"z": 1, "y": 2}})[0])[-2:] == ["y", "z"]


def test_array_modifiers() -> None:
    assert logged({"$push": {"arr": 4}}) == {"sarr": {"a": True, "u3": 4}}
    assert logged({"$push": {"arr": {"$each": [4, 5]}}}) == {"sarr": {"a": True, "u3": 4, "u4": 5}}
    assert logged({"$push": {"arr": {"$each": [0], "$position": 0}}}) == {"u": {"arr": [0, 1, 2, 3]}}
    assert logged({"$pop": {"arr": 1}}) == {"u": {"arr": [1, 2]}}  # not a truncation
    assert logged({"$pop": {"arr": -1}}) == {"u": {"arr": [2, 3]}}
    assert logged({"$pull": {"arr": 2}}) == {"u": {"arr": [1, 3]}}
    assert logged({"$addToSet": {"arr": 9}}) == {"u": {"arr": [1, 2, 3, 9]}}
    assert logged({"$set": {"arr.1": 7}}) == {"sarr": {"a": True, "u1": 7}}
    assert logged({"$set": {"objs.$[o].x": 0}}, array_filters=[{"o.x": 2}]) == {"sobjs": {"a": True, "s1": {"u": {"x": 0}}}}
    assert logged({"$inc": {"objs.0.x": 1}}) == {"sobjs": {"a": True, "s0": {"u": {"x": 2}}}}


def test_unset_rename_and_no_ops() -> None:
    assert logged({"$unset": {"a.b": ""}}) == {"sa": {"d": {"b": False}}}
    assert logged({"$unset": {"arr.0": ""}}) == {"sarr": {"a": True, "u0": None}}  # an array element becomes null
    assert logged({"$rename": {"n": "m"}}) == {"d": {"n": False}, "i": {"m": 5}}
    assert logged({"$set": {"n": 5}, "$unset": {"missing": ""}}) == {}
    assert logged({"$inc": {"n": 0}}) == {}
    description = update_description(logged({"$set": {"a.c": {"d": 1, "e": 2}}, "$unset": {"n": ""}}) or {})
    assert description == {"updatedFields": {"a.c": {"d": 1, "e": 2}}, "removedFields": ["n"], "truncatedArrays": []}


def test_replacements_and_pipelines_have_no_logged_diff() -> None:
    assert logged({"x": 1}) is None
    assert logged([{"$set": {"n": 6}}]) is None


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
    if diff is None:  # logged as a replacement: only when the diff would outweigh the document
        assert len(bson.encode(post)) < 4096
        return
    result = apply_diff(pre, diff)
    assert strict_equal(result, post), (pre, post, diff, result)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # timing is not what is tested
@given(_doc, _doc)
def test_update_description_applied_to_pre_gives_post(pre: dict[str, Any], post: dict[str, Any]) -> None:
    """Up to the order of fields, which the description cannot express (mongod's neither)."""
    diff = compute_diff({"pad": PAD * 8, **pre}, {"pad": PAD * 8, **post})
    assert diff is not None
    desc = update_description(diff)
    result = apply_description({"pad": PAD * 8, **pre}, desc)
    result.pop("pad")
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
