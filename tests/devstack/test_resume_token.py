"""Resume tokens: mongod's KeyString layout, ordering, decoding and rejection of garbage."""

from __future__ import annotations

import struct
import uuid
from decimal import Decimal

import pytest
from bson import Binary, Decimal128, Int64, ObjectId, Timestamp
from hypothesis import given
from hypothesis import strategies as st

from mongocdc_devstack import resume_token as rt
from mongocdc_devstack.errors import CommandError

UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")

# A token for {_id: ObjectId('64a1b2c3d4e5f60718293a4b')} inserted at Timestamp(1700000000, 1), laid
# out byte by byte as mongod 7.0 writes it: 82 <ts> 2B04 (version 2) 2C0100 (event token)
# 29 (txnOpIndex 0) 6E (fromInvalidate false) 5A1004<uuid> then the eventIdentifier object.
EXPECTED_INSERT_HEX = (
    "826553F10000000001" "2B04" "2C0100" "29" "6E" "5A1004" "12345678123456781234567812345678"
    "46" "3C" "6F7065726174696F6E5479706500" "3C" "696E7365727400"
    "46" "646F63756D656E744B657900" "46" "64" "5F696400" "64" "64A1B2C3D4E5F60718293A4B" "00" "00" "04"
)


def test_event_token_matches_mongods_byte_layout() -> None:
    data = rt.ResumeTokenData(
        Timestamp(1700000000, 1),
        uuid=UUID,
        event_identifier={"operationType": "insert", "documentKey": {"_id": ObjectId("64a1b2c3d4e5f60718293a4b")}},
    )
    assert rt.encode(data) == {"_data": EXPECTED_INSERT_HEX}
    assert rt.decode({"_data": EXPECTED_INSERT_HEX}) == data


def test_high_water_mark_token_layout() -> None:
    token = rt.high_water_mark(Timestamp(1700000000, 7))
    assert token == {"_data": "826553F10000000007" + "2B04" + "29" + "29" + "6E" + "14" + "04"}
    decoded = rt.decode(token)
    assert decoded.is_high_water_mark and decoded.uuid is None and decoded.event_identifier is None


def test_fast_encoder_agrees_with_general_encoder() -> None:
    encoder = rt.EventTokenEncoder()
    for key in ({"_id": 1}, {"_id": "a\x00b"}, {"_id": ObjectId()}, {"_id": Int64(5)}, {"_id": 2.5},
                {"_id": -4}, {"_id": {"x": [1, "y"]}}, {"_id": 1, "sk": "shard"}):
        for index in (0, 3, 300):
            ts = Timestamp(1700000000, 9)
            expected = rt.encode(
                rt.ResumeTokenData(ts, txn_op_index=index, uuid=UUID,
                                   event_identifier={"operationType": "update", "documentKey": key})
            )
            assert encoder.crud(ts, index, Binary(UUID.bytes, 4), "update", key) == expected


def test_int64_and_double_ids_carry_type_bits_and_round_trip() -> None:
    for value, kind in ((Int64(7), Int64), (7.0, float), (7, int)):
        token = rt.encode(
            rt.ResumeTokenData(Timestamp(5, 1), uuid=UUID,
                               event_identifier={"operationType": "delete", "documentKey": {"_id": value}})
        )
        assert ("_typeBits" in token) == (kind is not int)
        back = rt.decode(token).event_identifier
        assert back is not None
        assert type(back["documentKey"]["_id"]) is kind and back["documentKey"]["_id"] == 7


def _token_for(ts: tuple[int, int], index: int, invalidate: bool, key: int) -> str:
    return str(rt.encode(
        rt.ResumeTokenData(Timestamp(*ts), txn_op_index=index, from_invalidate=invalidate, uuid=UUID,
                           event_identifier={"operationType": "insert", "documentKey": {"_id": key}})
    )["_data"])


@given(
    st.lists(
        st.tuples(
            st.tuples(st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1)),
            st.integers(0, 5000),
            st.booleans(),
        ),
        min_size=2,
        max_size=8,
    )
)
def test_hex_order_is_event_order(positions: list[tuple[tuple[int, int], int, bool]]) -> None:
    """clusterTime, then txnOpIndex, then fromInvalidate decide the order, as in the stream."""
    tokens = [(_token_for(ts, index, inv, 1), (ts, index, inv)) for ts, index, inv in positions]
    by_hex = [pos for _, pos in sorted(tokens)]
    assert by_hex == sorted(pos for _, pos in tokens)


@given(st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1), st.integers(-(2**63) + 1, 2**63 - 1))
def test_first_byte_and_timestamp_readable_like_real_mongodb(seconds: int, inc: int, key: int) -> None:
    token = rt.encode(
        rt.ResumeTokenData(Timestamp(seconds, inc), uuid=UUID,
                           event_identifier={"operationType": "insert", "documentKey": {"_id": key}})
    )
    raw = bytes.fromhex(token["_data"])
    assert raw[0] == 130
    assert struct.unpack(">II", raw[1:9]) == (seconds, inc)
    assert rt.cluster_time_of(token) == Timestamp(seconds, inc)
    decoded = rt.decode(token).event_identifier
    assert decoded is not None and decoded["documentKey"]["_id"] == key


_scalars = st.one_of(
    st.integers(-(2**63) + 1, 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f == 0 or abs(f) >= 2**-255),
    st.text(max_size=8),
    st.booleans(),
    st.none(),
    st.builds(ObjectId),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text("abc", max_size=3), inner, max_size=3)),
    max_leaves=8,
)


@given(_values)
def test_round_trip_of_document_keys(value: object) -> None:
    data = rt.ResumeTokenData(Timestamp(9, 9), uuid=UUID,
                              event_identifier={"operationType": "replace", "documentKey": {"_id": value}})
    decoded = rt.decode(rt.encode(data))
    assert decoded.event_identifier == data.event_identifier


@given(st.integers(-(2**52), 2**52), st.integers(-(2**52), 2**52))
def test_numbers_order_like_their_values(a: int, b: int) -> None:
    """KeyString numbers sort numerically across ints and doubles (documentKey ordering)."""
    def hex_of(v: float | int) -> str:
        return str(rt.encode(rt.ResumeTokenData(Timestamp(1, 1), uuid=UUID,
                                                event_identifier={"operationType": "insert",
                                                                  "documentKey": {"_id": v}}))["_data"])

    x, y = a / 4, b
    if x != y:
        assert (hex_of(x) < hex_of(y)) == (x < y)


@pytest.mark.parametrize(
    ("token", "code"),
    [
        ({"_data": 12}, 40647),
        ({}, 40647),
        ({"_data": "zz"}, 9),
        ({"_data": "ABC"}, 9),
        ({"_data": ""}, 40649),
        ({"_data": "DEADBEEF"}, 260),
        ({"_data": "82"}, 260),
        ({"_data": "826553F10000000001"}, 260),
        ({"_data": "826553F100000000010404"}, 50796),
        ({"_data": "826553F100000000012B0A2C0100296E1404"}, 50795),
        ({"_data": "826553F100000000012B042B02296E1404"}, 51057),
        ({"_data": rt.high_water_mark(Timestamp(1, 1))["_data"][:-2] + "2B0204"}, 6189504),
        ({"_data": rt.high_water_mark(Timestamp(1, 1))["_data"], "_typeBits": "x"}, 40648),
    ],
)
def test_garbage_tokens_are_rejected_with_mongods_codes(token: dict[str, object], code: int) -> None:
    with pytest.raises(CommandError) as info:
        rt.decode(token)
    assert info.value.code == code
    assert info.value.errmsg


def test_encoder_rejects_inconsistent_token_data() -> None:
    with pytest.raises(ValueError, match="high water mark"):
        rt.encode(rt.ResumeTokenData(Timestamp(1, 1), token_type=rt.HIGH_WATER_MARK_TOKEN, uuid=UUID))
    with pytest.raises(ValueError, match="event identifier"):
        rt.encode(rt.ResumeTokenData(Timestamp(1, 1)))
    with pytest.raises(ValueError, match="cannot be encoded"):
        rt.encode(rt.ResumeTokenData(Timestamp(1, 1), event_identifier={"operationType": "x", "v": object()}))


def _decimal_token(value: Decimal128) -> dict[str, object]:
    return rt.encode(rt.ResumeTokenData(Timestamp(1700000000, 1), uuid=UUID,
                                        event_identifier={"operationType": "insert", "documentKey": {"_id": value}}))  # fmt: skip


def test_decimal_equal_to_a_double_shares_its_keystring_and_differs_in_type_bits() -> None:
    as_double = rt.encode(rt.ResumeTokenData(Timestamp(1700000000, 1), uuid=UUID,
                                             event_identifier={"operationType": "insert", "documentKey": {"_id": 1.5}}))  # fmt: skip
    as_decimal = _decimal_token(Decimal128("1.5"))
    assert as_decimal["_data"] == as_double["_data"]
    assert as_decimal["_typeBits"] != as_double["_typeBits"]


_DECIMALS = st.one_of(
    st.decimals(allow_nan=False, allow_infinity=False, places=4, min_value=-(10**12), max_value=10**12),
    st.builds(lambda digits, scale, negative: Decimal(f"{'-' if negative else ''}{digits}E-{scale}"),
              st.integers(min_value=0, max_value=10**34 - 1), st.integers(min_value=0, max_value=40), st.booleans()),  # fmt: skip
    st.sampled_from([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity"), Decimal("-0"), Decimal("0E+10")]),
)


@given(st.lists(_DECIMALS, min_size=2, max_size=8))
def test_decimal_ids_round_trip_and_order_like_their_values(values: list[Decimal]) -> None:
    """A Decimal128 _id goes into a resume token as mongod encodes it (issue 11: getMore failed)."""
    tokens = []
    for value in values:
        token = _decimal_token(Decimal128(value))
        back = rt.decode(token).event_identifier["documentKey"]["_id"]
        assert str(back) == str(Decimal128(value))
        if not value.is_nan():
            tokens.append((str(token["_data"]), value))
    tokens.sort(key=lambda pair: pair[0])
    for (_, low), (_, high) in zip(tokens, tokens[1:], strict=False):
        assert low <= high
