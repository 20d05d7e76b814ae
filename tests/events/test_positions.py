"""Positions order like the stream, print sortably, and come out of resume tokens."""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from mongocdc_core.positions import Position, decode_resume_token_timestamp

u32 = st.integers(min_value=0, max_value=0xFFFFFFFF)
positions = st.builds(Position, u32, u32, st.integers(min_value=0, max_value=999_999))


def test_to_str_matches_documented_example() -> None:
    assert Position(1_700_000_000, 1, 0).to_str() == "0001700000000.0000000001.000000"


def test_ordering_is_clustertime_then_ordinal() -> None:
    assert Position(1, 5) < Position(2, 0) < Position(2, 1) < Position(2, 1, 1)
    assert Position.MIN == Position(0, 0, 0)
    assert min(Position(3, 3), Position.MIN) is Position.MIN


@given(positions, positions)
def test_string_order_equals_position_order(a: Position, b: Position) -> None:
    assert (a.to_str() < b.to_str()) == (a < b)
    assert Position.parse(a.to_str()) == a


def test_timestamp_round_trip() -> None:
    p = Position.from_timestamp(Timestamp(1_558_965_508, 31), ordinal=2)
    assert p == Position(1_558_965_508, 31, 2)
    assert p.timestamp == Timestamp(1_558_965_508, 31)


def test_parse_accepts_unpadded_and_rejects_garbage() -> None:
    assert Position.parse("5.6") == Position(5, 6, 0)
    for bad in ("", "1", "a.b.c", "1.2.3.4", "-1.2", "1.2.x"):
        with pytest.raises(ValueError, match="not a position"):
            Position.parse(bad)


def test_invalid_fields_are_rejected() -> None:
    with pytest.raises(ValueError, match="seconds"):
        Position(-1, 0)
    with pytest.raises(ValueError, match="ordinal"):
        Position(1, 0, 1_000_000)
    with pytest.raises(ValueError, match="bson.Timestamp"):
        Position.from_timestamp(5)  # type: ignore[arg-type]


def test_positions_are_frozen() -> None:
    with pytest.raises(AttributeError):
        Position(1, 2).seconds = 3  # type: ignore[misc]


def _token(seconds: int, inc: int, tail: str = "2B022C0100296E5A1004") -> str:
    return "82" + seconds.to_bytes(4, "big").hex().upper() + inc.to_bytes(4, "big").hex().upper() + tail


def test_decode_resume_token_from_mapping_and_string() -> None:
    token = _token(1_700_000_000, 7)
    assert decode_resume_token_timestamp({"_data": token}) == Timestamp(1_700_000_000, 7)
    assert decode_resume_token_timestamp(token) == Timestamp(1_700_000_000, 7)
    # A post-batch (high-water-mark) token is just the timestamp plus a different tail.
    assert decode_resume_token_timestamp(_token(12, 34, "0128")) == Timestamp(12, 34)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ({"_data": "zz"}, "not a hex string"),
        ({"nothing": 1}, "no hex string"),
        ("8200", "too short"),
        ("01" + "00" * 8, "type byte 1"),
    ],
)
def test_decode_resume_token_rejects_bad_tokens(token: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_resume_token_timestamp(token)  # type: ignore[arg-type]
