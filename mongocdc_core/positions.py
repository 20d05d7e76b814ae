"""Totally ordered stream positions and resume-token decoding.

A position is an event's ``clusterTime`` (seconds, increment) plus an ordinal that orders the
events sharing one clusterTime (the operations of one transaction). Positions travel with every
record, so "the record with the highest position wins" is the single rule for current state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from bson.timestamp import Timestamp

_UINT32_MAX = 0xFFFFFFFF
_ORDINAL_MAX = 999_999
_SECONDS_WIDTH = 13
_INCREMENT_WIDTH = 10
_ORDINAL_WIDTH = 6
#: ``to_str``'s format, built once: a nested width in an f-string is parsed again at every call (a
#: position is written per record: offsets, landing rows, the Kafka position header).
_TEXT = f"%0{_SECONDS_WIDTH}d.%0{_INCREMENT_WIDTH}d.%0{_ORDINAL_WIDTH}d"
_KEYSTRING_TIMESTAMP = 130  # KeyString type byte of a BSON Timestamp at the start of a resume token
_new = object.__new__
_set = object.__setattr__


@dataclass(frozen=True, slots=True, order=True)
class Position:
    """clusterTime plus an ordinal; field order makes the dataclass ordering the stream order."""

    seconds: int
    increment: int
    ordinal: int = 0

    MIN: ClassVar[Position]

    def __post_init__(self) -> None:
        for name, value, limit in (
            ("seconds", self.seconds, _UINT32_MAX),
            ("increment", self.increment, _UINT32_MAX),
            ("ordinal", self.ordinal, _ORDINAL_MAX),
        ):
            if type(value) is not int or not 0 <= value <= limit:
                raise ValueError(f"Position.{name} must be an int in [0, {limit}], got {value!r}")

    @classmethod
    def from_timestamp(cls, ts: Timestamp, ordinal: int = 0) -> Position:
        """Position of an event whose clusterTime is ``ts``.

        Runs once per event: a Timestamp's parts are already unsigned 32-bit, so only the ordinal
        is checked (the frozen dataclass's own ``__init__`` costs three times as much).
        """
        if type(ts) is not Timestamp and not isinstance(ts, Timestamp):
            raise ValueError(f"expected a bson.Timestamp, got {type(ts).__name__}: {ts!r}")
        return cls.from_cluster_time(ts.time, ts.inc, ordinal)

    @classmethod
    def from_cluster_time(cls, seconds: int, increment: int, ordinal: int = 0) -> Position:
        """:meth:`from_timestamp` of a clusterTime's parts, as read from its BSON (unsigned 32-bit)."""
        if type(ordinal) is not int or not 0 <= ordinal <= _ORDINAL_MAX:
            raise ValueError(f"Position.ordinal must be an int in [0, {_ORDINAL_MAX}], got {ordinal!r}")
        position = _new(cls)
        _set(position, "seconds", seconds)
        _set(position, "increment", increment)
        _set(position, "ordinal", ordinal)
        return position

    @property
    def timestamp(self) -> Timestamp:
        """The clusterTime part, e.g. for ``startAtOperationTime``."""
        return Timestamp(self.seconds, self.increment)

    def to_str(self) -> str:
        """Zero-padded text whose string order equals position order (safe in file names and offsets)."""
        return _TEXT % (self.seconds, self.increment, self.ordinal)

    @classmethod
    def parse(cls, text: str) -> Position:
        """Inverse of :meth:`to_str`; also accepts unpadded ``seconds.increment[.ordinal]``."""
        parts = text.split(".") if isinstance(text, str) else []
        if len(parts) not in (2, 3) or not all(p.isdigit() and p.isascii() for p in parts):
            raise ValueError(f"not a position (expected 'seconds.increment.ordinal'): {text!r}")
        return cls(*(int(p) for p in parts))

    def __str__(self) -> str:
        return self.to_str()


Position.MIN = Position(0, 0, 0)


def decode_resume_token_timestamp(token: Mapping[str, Any] | str) -> Timestamp:
    """The clusterTime encoded at the start of a change stream resume token.

    The ``_data`` hex string of a resume token (event tokens and post-batch high-water-mark tokens
    alike) begins with the KeyString type byte 130 followed by the 8-byte big-endian timestamp
    (4 bytes seconds, 4 bytes increment).
    """
    data: Any = token.get("_data") if isinstance(token, Mapping) else token
    if not isinstance(data, str):
        raise ValueError(f"resume token has no hex string '_data': {token!r}")
    try:
        raw = bytes.fromhex(data)
    except ValueError:
        raise ValueError(f"resume token '_data' is not a hex string: {token!r}") from None
    if len(raw) < 9:
        raise ValueError(f"resume token is too short to hold a clusterTime: {token!r}")
    if raw[0] != _KEYSTRING_TIMESTAMP:
        raise ValueError(
            f"resume token does not start with a clusterTime (type byte {raw[0]}, expected "
            f"{_KEYSTRING_TIMESTAMP}): {token!r}"
        )
    return Timestamp(int.from_bytes(raw[1:5], "big"), int.from_bytes(raw[5:9], "big"))


def token_timestamp(token: Mapping[str, Any] | None) -> Timestamp | None:
    """clusterTime of a resume token, None when absent or not decodable (tokens are opaque)."""
    if not token:
        return None
    try:
        return decode_resume_token_timestamp(token)
    except ValueError:
        return None
