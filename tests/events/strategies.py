"""Hypothesis strategies for documents holding every BSON type, as bson.decode returns them."""

from __future__ import annotations

import datetime
from typing import Any

import bson
from bson.binary import Binary
from bson.code import Code
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from hypothesis import strategies as st

u32 = st.integers(min_value=0, max_value=0xFFFFFFFF)
text = st.text(alphabet=st.characters(codec="utf-8"), max_size=12)
# Field names: unicode, no NUL (BSON cstring), no dots and no leading '$' (not storable in MongoDB).
field_names = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="\x00."), min_size=1, max_size=8
).filter(lambda s: not s.startswith("$"))

object_ids = st.binary(min_size=12, max_size=12).map(ObjectId)
int32s = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64s = st.integers(min_value=-(2**63), max_value=2**63 - 1).map(Int64)
doubles = st.floats(allow_nan=False) | st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0])
decimals = st.decimals(
    allow_nan=False, allow_infinity=False, places=4, min_value=-(10**12), max_value=10**12
).map(lambda d: Decimal128(str(d))) | st.sampled_from(
    [Decimal128("NaN"), Decimal128("Infinity"), Decimal128("-0"), Decimal128("1.000E+10")]
)
binaries = st.builds(
    lambda data, subtype: Binary(data, subtype),
    st.binary(max_size=20),
    st.sampled_from([0, 1, 2, 3, 5, 6, 7, 8, 0x80, 0xFF]),
) | st.binary(min_size=16, max_size=16).map(lambda b: Binary(b, 4))
regexes = st.builds(
    Regex,
    st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
    st.sets(st.sampled_from("imsux")).map(lambda s: "".join(sorted(s))),
)
datetimes = st.datetimes(min_value=datetime.datetime(1, 1, 1), max_value=datetime.datetime(9999, 12, 31)).map(
    lambda d: d.replace(microsecond=d.microsecond // 1000 * 1000)
)
scalars: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    int32s,
    int64s,
    doubles,
    text,
    object_ids,
    decimals,
    binaries,
    regexes,
    text.map(lambda s: Code(s)),
    st.builds(Timestamp, u32, u32),
    datetimes,
    st.just(MinKey()),
    st.just(MaxKey()),
)


def _documents(children: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(field_names, children, max_size=5)


values = st.recursive(
    scalars | st.builds(lambda code, scope: Code(code, scope), text, _documents(scalars)),
    lambda children: st.lists(children, max_size=4) | _documents(children),
    max_leaves=20,
)
documents = _documents(values)
id_values = st.one_of(
    int32s, int64s, doubles, text, object_ids, decimals, binaries, datetimes, _documents(scalars)
)


def normalized(value: Any) -> Any:
    """What a value looks like after a BSON round trip (as the change stream delivers it)."""
    return bson.decode(bson.encode({"v": value}))["v"]


def same_bson(a: Any, b: Any) -> bool:
    """Equality that respects BSON types and treats NaN as equal to itself."""
    return bson.encode({"v": a}) == bson.encode({"v": b})
