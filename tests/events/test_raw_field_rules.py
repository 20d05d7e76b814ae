"""Field exclusions and renames on the compiled path: the same bytes as the Python path's.

The compiled module applies ``field.exclude.list`` and ``field.renames`` while it writes a
document (``before``, ``after``, a snapshot read) or an update's dotted paths (``updatedFields``,
``removedFields``, ``truncatedArrays``), in every format it writes, when the rules' result does not
depend on the order they apply in (``CollectionFields.compiled_rules``); rule sets of another kind
stay on the Python path. Each test converts the same events or reads both ways.
"""

from __future__ import annotations

from typing import Any

from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from mongocdc_core.events import raw
from mongocdc_core.events.transforms import FieldTransforms

from .helpers import POSITION, converter
from .test_raw_changes import FORMATS, _both_ways, _event, compiled
from .test_raw_reads import TS, _left, _raw, plain_scalars

#: Document names; rename targets are others, so that a rename never meets a name the document has.
NAMES = ["a", "b", "c"]
TARGETS = ["x", "y"]

documents = st.recursive(
    plain_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.sampled_from(NAMES), children, max_size=3),
    max_leaves=12,
)
top_documents = st.dictionaries(st.sampled_from(NAMES), documents, max_size=3)
paths = st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(".".join)
excludes = st.lists(paths.map(lambda p: f"inventory.customers.{p}"), max_size=2)
renames = st.lists(
    st.tuples(paths, st.sampled_from(TARGETS)).map(lambda r: f"inventory.customers.{r[0]}:{r[1]}"), max_size=3
)


def _compiled(exclude: list[str], rename: list[str], event_format: str) -> Any:
    """The compiled module's form of the rules (None when they stay on the Python path)."""
    transforms = FieldTransforms(exclude, rename, renamed_last=event_format == "debezium_3x")
    return raw.field_rules(transforms.for_collection("inventory", "customers"))


#: Dotted update paths: names and array indexes.
update_paths = st.lists(st.sampled_from([*NAMES, "0", "12"]), min_size=1, max_size=3).map(".".join)
descriptions = st.fixed_dictionaries({
    "updatedFields": st.dictionaries(update_paths, documents, max_size=4),
    "removedFields": st.lists(update_paths, max_size=3),
    "truncatedArrays": st.lists(st.fixed_dictionaries({"field": update_paths, "newSize": st.integers(0, 9)}), max_size=2),
})  # fmt: skip


@settings(max_examples=400, deadline=None, phases=[Phase.generate])
@given(st.sampled_from(["insert", "update", "replace", "delete"]), top_documents, top_documents, descriptions,
       excludes, renames, st.sampled_from(FORMATS), st.booleans())  # fmt: skip
def test_events_with_field_rules_are_the_python_paths_bytes(
    op: str, full: dict[str, Any], before: dict[str, Any], desc: dict[str, Any], exclude: list[str], rename: list[str],
    event_format: str, schemas: bool,
) -> None:  # fmt: skip
    extra: dict[str, Any] = {"fullDocumentBeforeChange": {"_id": 1, **before}}
    if op == "update":
        extra["updateDescription"] = desc
    event = _event(op, 1, full if op != "delete" else None, **extra)
    settings_: dict[str, Any] = {"field_exclude_list": tuple(exclude), "field_renames": tuple(rename)}
    capture_mode = "change_streams_update_full_with_pre_image"
    if _compiled(exclude, rename, event_format) is not None:
        assert compiled(event, event_format, capture_mode=capture_mode, **settings_), (
            "rules the compiled module takes left an event to Python"
        )
    from_raw, from_dicts = _both_ways(event, event_format=event_format, schemas_enable=schemas,
                                      capture_mode=capture_mode, **settings_)  # fmt: skip
    assert from_raw == from_dicts and from_raw


@settings(max_examples=200, deadline=None, phases=[Phase.generate])
@given(st.lists(top_documents, min_size=1, max_size=4), excludes, renames, st.sampled_from(FORMATS))
def test_reads_with_field_rules_are_the_python_paths_bytes(
    bodies: list[dict[str, Any]], exclude: list[str], rename: list[str], event_format: str
) -> None:
    docs = [{"_id": i, **body} for i, body in enumerate(bodies)]
    batch = _raw(docs)
    rules = _compiled(exclude, rename, event_format)
    if rules is not None:
        assert not _left(batch, event_format, rules), "rules the compiled module takes left a read to Python"
    conv = converter(field_exclude_list=tuple(exclude), field_renames=tuple(rename), event_format=event_format)
    markers = ["true"] * len(docs)
    from_raw = conv.convert_reads(batch, markers, "inventory", "customers", POSITION, TS)
    assert list(from_raw) == conv.convert_reads(batch.decoded(), markers, "inventory", "customers", POSITION, TS)


def test_rules_whose_result_depends_on_their_order_stay_on_the_python_path() -> None:
    """A chain (a renamed to x, then x's field renamed), two renames onto one name, a rename inside a
    renamed field and a name adjustment are the Python path's; a rename onto a name the document
    already has (a dict merges the two) is left to it by the module, with the same bytes."""
    for exclude, rename in (([], ["inventory.customers.a:x", "inventory.customers.x.b:y"]),
                            ([], ["inventory.customers.a:x", "inventory.customers.b:x"]),
                            ([], ["inventory.customers.a:x", "inventory.customers.a.b:y"])):  # fmt: skip
        assert _compiled(exclude, rename, "change_streams") is None
    adjusted = FieldTransforms([], ["inventory.customers.a:x"], "avro").for_collection("inventory", "customers")
    assert adjusted is not None and raw.field_rules(adjusted) is None
    onto = ["inventory.customers.a:b"]
    event = _event("insert", 1, {"a": 1, "b": 2, "c": {"a": 3}})
    for event_format in FORMATS:
        assert _compiled([], onto, event_format) is not None
        from_raw, from_dicts = _both_ways(event, field_renames=tuple(onto), event_format=event_format)
        assert from_raw == from_dicts
        assert not compiled(event, event_format, field_renames=tuple(onto))
