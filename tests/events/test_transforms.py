"""field.exclude.list, field.renames and field.name.adjustment.mode on every document part."""

from __future__ import annotations

from typing import Any

import pytest
from bson import json_util

from mongocdc_core.events.transforms import FieldTransforms

from .helpers import POSITION, change, converter, insert, payload, update

DOC: dict[str, Any] = {
    "_id": 1,
    "name": "Anne",
    "email": "a@b.c",
    "address": {"street": "Main", "city": "Springfield"},
    "items": [{"sku": "x", "price": 1}, {"sku": "y", "price": 2}, "loose"],
}


def after(
    options: dict[str, Any],
    doc: dict[str, Any] | None = None,
    ns: tuple[str, str] = ("inventory", "customers"),
) -> Any:
    conv = converter(**options)
    ev = insert(doc or DOC, ns={"db": ns[0], "coll": ns[1]})
    return json_util.loads(payload(conv.convert_change(ev, POSITION)[0])["after"])


def description(options: dict[str, Any], desc: dict[str, Any]) -> Any:
    p = payload(converter(**options).convert_change(update(updateDescription=desc), POSITION)[0])
    out = dict(p["updateDescription"])
    if out["updatedFields"] is not None:
        out["updatedFields"] = json_util.loads(out["updatedFields"])
    return out


def test_exclude_top_level_and_nested_fields() -> None:
    got = after({"field_exclude_list": ("inventory.customers.email", "inventory.customers.address.street")})
    assert got == {"_id": 1, "name": "Anne", "address": {"city": "Springfield"}, "items": DOC["items"]}


def test_exclude_inside_arrays_of_documents() -> None:
    got = after({"field_exclude_list": ("inventory.customers.items.price",)})
    assert got["items"] == [{"sku": "x"}, {"sku": "y"}, "loose"]


@pytest.mark.parametrize("rule", ["*.customers.email", "inventory.*.email", "*.*.email", "inv*.cust*.email"])
def test_exclude_with_wildcards(rule: str) -> None:
    assert "email" not in after({"field_exclude_list": (rule,)})


@pytest.mark.parametrize("ns", [("other", "customers"), ("inventory", "orders")])
def test_rules_for_other_collections_do_not_apply(ns: tuple[str, str]) -> None:
    assert after({"field_exclude_list": ("inventory.customers.email",)}, ns=ns)["email"] == "a@b.c"


def test_dotted_collection_names() -> None:
    got = after(
        {"field_exclude_list": ("inventory.orders.archive.email",)}, ns=("inventory", "orders.archive")
    )
    assert "email" not in got


def test_excluding_id_keeps_the_key() -> None:
    conv = converter(field_exclude_list=("inventory.customers._id",), schemas_enable=False)
    record = conv.convert_change(insert(DOC), POSITION)[0]
    assert record.key == b'{"id":"1"}'
    assert "_id" not in json_util.loads(payload(record)["after"])


def test_rename_keeps_field_position_and_applies_in_order() -> None:
    renames = (
        "inventory.customers.name:given",
        "inventory.customers.given:first",
        "inventory.customers.address.city:town",
    )
    got = after({"field_renames": renames})
    assert list(got) == ["_id", "first", "email", "address", "items"]
    assert got["address"] == {"street": "Main", "town": "Springfield"}


def test_rename_inside_arrays() -> None:
    got = after({"field_renames": ("inventory.customers.items.price:cost",)})
    assert got["items"] == [{"sku": "x", "cost": 1}, {"sku": "y", "cost": 2}, "loose"]


def test_update_description_exclusions() -> None:
    desc = {
        "updatedFields": {
            "email": "new",
            "address.street": "Elm",
            "address": {"street": "Oak", "city": "X"},
            "items.1.price": 5,
            "items.1": {"sku": "z", "price": 9},
            "name": "Anna",
        },
        "removedFields": ["email", "address.street", "phone"],
        "truncatedArrays": [{"field": "email", "newSize": 1}, {"field": "items", "newSize": 2}],
    }
    rules = {
        "field_exclude_list": (
            "inventory.customers.email",
            "inventory.customers.address.street",
            "inventory.customers.items.price",
        )
    }
    assert description(rules, desc) == {
        "updatedFields": {"address": {"city": "X"}, "items.1": {"sku": "z"}, "name": "Anna"},
        "removedFields": ["phone"],
        "truncatedArrays": [{"field": "items", "size": 2}],
    }


def test_update_description_renames() -> None:
    desc = {
        "updatedFields": {"address.street": "Elm", "address": {"street": "Oak"}, "items.0.price": 3},
        "removedFields": ["address.street"],
        "truncatedArrays": [],
    }
    rules = {
        "field_renames": ("inventory.customers.address.street:road", "inventory.customers.items.price:cost")
    }
    assert description(rules, desc) == {
        "updatedFields": {"address.road": "Elm", "address": {"road": "Oak"}, "items.0.cost": 3},
        "removedFields": ["address.road"],
        "truncatedArrays": None,
    }


def test_rules_apply_to_pre_images() -> None:
    conv = converter(
        capture_mode="change_streams_with_pre_image", field_exclude_list=("inventory.customers.email",)
    )
    ev = change("delete", fullDocumentBeforeChange=DOC)
    assert "email" not in json_util.loads(payload(conv.convert_change(ev, POSITION)[0])["before"])


def test_legacy_patch_is_transformed() -> None:
    conv = converter(event_format="oplog_1x", field_exclude_list=("inventory.customers.email",))
    desc = {
        "updatedFields": {"email": "x", "name": "y"},
        "removedFields": ["email", "phone"],
        "truncatedArrays": [],
    }
    p = payload(conv.convert_change(update(updateDescription=desc), POSITION)[0])
    assert p["patch"] == '{"$set":{"name":"y"},"$unset":{"phone":true}}'


def test_field_name_adjustment_avro() -> None:
    doc = {"_id": 1, "first-name": "A", "nested": {"a b": 2, "ok_1": 3}, "arr": [{"x-y": 1}], "9lives": 0}
    got = after({"field_name_adjustment_mode": "avro"}, doc)
    assert got == {
        "_id": 1,
        "first_name": "A",
        "nested": {"a_b": 2, "ok_1": 3},
        "arr": [{"x_y": 1}],
        "_lives": 0,
    }
    got = description(
        {"field_name_adjustment_mode": "avro"},
        {"updatedFields": {"a-b.0.c d": {"e-f": 1}}, "removedFields": ["x-y"], "truncatedArrays": []},
    )
    assert got["updatedFields"] == {"a_b.0.c_d": {"e_f": 1}}
    assert got["removedFields"] == ["x_y"]


def test_field_name_adjustment_avro_unicode() -> None:
    got = after({"field_name_adjustment_mode": "avro_unicode"}, {"_id": 1, "a-b": 1, "c_d": 2})
    assert got == {"_u005fid": 1, "a_u002db": 1, "c_u005fd": 2}


def test_no_rules_means_no_transform() -> None:
    assert FieldTransforms((), ()).for_collection("a", "b") is None
    assert FieldTransforms(("x.y.z",), ()).for_collection("a", "b") is None


@pytest.mark.parametrize(
    ("excludes", "renames", "message"),
    [
        (("inventory.customers",), (), "field.exclude.list entry 'inventory.customers'"),
        (("inventory..x",), (), "field.exclude.list"),
        ((), ("inventory.customers.a",), "field.renames entry 'inventory.customers.a'"),
        ((), ("inventory.customers.a:b.c",), "field.renames"),
        ((), ("inventory.customers.a:",), "field.renames"),
    ],
)
def test_malformed_rules_are_named(excludes: tuple[str, ...], renames: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FieldTransforms(excludes, renames)


def test_transform_does_not_mutate_the_input() -> None:
    doc = {"_id": 1, "a": {"b": 1, "c": 2}}
    after({"field_exclude_list": ("inventory.customers.a.b",)}, doc)
    assert doc == {"_id": 1, "a": {"b": 1, "c": 2}}
