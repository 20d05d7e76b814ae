"""``_id`` ranges of one collection: how a huge collection is split, queried and resumed.

MongoDB orders ``_id`` values by type bracket first (MinKey < null < numbers < strings < objects
< binary < ObjectId < booleans < dates < timestamps < regexes < … < MaxKey) and by value inside a
bracket. A query comparison (``{_id: {$gte: x}}``) only matches values of ``x``'s bracket, so a
range whose ends lie in different brackets is expressed as the tail of the low bracket, every
whole bracket in between (``$type``), and the head of the high bracket. Every piece uses the
``_id`` index, on mongod as on any driver-visible server, and the ranges of a plan cover each
document exactly once, whatever mix of ``_id`` types the collection holds.

Boundaries are quantiles of a random sample of ``_id`` values sorted by the server, in its own order.
"""

from __future__ import annotations

import datetime
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bson import Binary, Decimal128, Int64, ObjectId, Timestamp, json_util
from bson.binary import UuidRepresentation
from bson.codec_options import DatetimeConversion
from bson.datetime_ms import DatetimeMS
from pymongo.collection import Collection

_CANONICAL = json_util.CANONICAL_JSON_OPTIONS.with_options(
    uuid_representation=UuidRepresentation.STANDARD, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)

#: MongoDB's canonical type brackets in sort order, each with the ``$type`` aliases it holds.
BRACKETS: tuple[tuple[str, ...], ...] = (
    ("minKey",),
    ("null", "undefined"),
    ("double", "int", "long", "decimal"),
    ("string", "symbol"),
    ("object",),
    ("array",),
    ("binData",),
    ("objectId",),
    ("bool",),
    ("date",),
    ("timestamp",),
    ("regex",),
    ("dbPointer",),
    ("javascript",),
    ("javascriptWithScope",),
    ("maxKey",),
)
#: At most this many ranges per collection, and this many sampled keys per range to place the boundaries.
MAX_RANGES = 10_000
SAMPLES_PER_RANGE = 20

_NUMBERS, _STRINGS, _OBJECTS, _BINARY, _OBJECT_ID, _BOOL, _DATES, _TIMESTAMPS = 2, 3, 4, 6, 7, 8, 9, 10


def bracket_of(value: Any) -> int | None:
    """The bracket index of a value a range may be bounded by, or None (not usable as a bound).

    Only brackets whose values compare by value with ``$gte``/``$lt`` on every server qualify.
    """
    if isinstance(value, bool):
        return _BOOL
    if isinstance(value, (int, float, Int64, Decimal128)):
        return _NUMBERS
    if isinstance(value, str):
        return _STRINGS
    if isinstance(value, Mapping):
        return _OBJECTS
    if isinstance(value, (bytes, Binary, uuid.UUID)):
        return _BINARY
    if isinstance(value, ObjectId):
        return _OBJECT_ID
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return _DATES
    if isinstance(value, Timestamp):
        return _TIMESTAMPS
    return None


def _types(first: int, last: int) -> list[str]:
    """``$type`` aliases of the brackets ``first..last`` (inclusive)."""
    return [alias for bracket in BRACKETS[first : last + 1] for alias in bracket]


@dataclass(frozen=True)
class IdRange:
    """``_id`` from ``low`` (inclusive unless ``low_exclusive``; None: from the start) to ``high``
    (exclusive unless ``high_inclusive``; None: to the end), in the server's ``_id`` order."""

    low: Any = None
    high: Any = None
    low_exclusive: bool = False
    high_inclusive: bool = False

    @property
    def whole(self) -> bool:
        return self.low is None and self.high is None

    def after(self, key: Any) -> IdRange:
        """The rest of this range after ``key`` (a key read from it), for resuming."""
        return IdRange(key, self.high, low_exclusive=True, high_inclusive=self.high_inclusive)

    def query(self) -> dict[str, Any]:
        """A query document matching exactly the ``_id`` values of the range (uses the ``_id`` index)."""
        if self.whole:
            return {}
        low_bracket = 0 if self.low is None else _require_bracket(self.low)
        high_bracket = len(BRACKETS) - 1 if self.high is None else _require_bracket(self.high)
        low_op = "$gt" if self.low_exclusive else "$gte"
        high_op = "$lte" if self.high_inclusive else "$lt"
        if self.low is not None and self.high is not None and low_bracket == high_bracket:
            return {"_id": {low_op: self.low, high_op: self.high}}
        pieces: list[dict[str, Any]] = []
        first_whole, last_whole = low_bracket, high_bracket
        if self.low is not None:
            pieces.append({"_id": {low_op: self.low}})
            first_whole = low_bracket + 1
        if self.high is not None:
            last_whole = high_bracket - 1
        if first_whole <= last_whole:
            pieces.append({"_id": {"$type": _types(first_whole, last_whole)}})
        if self.high is not None:
            pieces.append({"_id": {high_op: self.high}})
        return pieces[0] if len(pieces) == 1 else {"$or": pieces}

    def to_json(self) -> dict[str, Any]:
        """Lossless JSON (canonical Extended JSON for the bounds), for the offsets."""
        return {
            "low": None if self.low is None else encode_key(self.low),
            "high": None if self.high is None else encode_key(self.high),
            "low_exclusive": self.low_exclusive,
            "high_inclusive": self.high_inclusive,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IdRange:
        low, high = data.get("low"), data.get("high")
        return cls(
            None if low is None else decode_key(low),
            None if high is None else decode_key(high),
            bool(data.get("low_exclusive", False)),
            bool(data.get("high_inclusive", False)),
        )

    def describe(self) -> str:
        def text(value: Any) -> str:
            return json_util.dumps(value, json_options=json_util.RELAXED_JSON_OPTIONS)

        low = "start" if self.low is None else ("(" if self.low_exclusive else "[") + text(self.low)
        high = "end" if self.high is None else text(self.high) + ("]" if self.high_inclusive else ")")
        return f"{low} .. {high}"


def encode_key(value: Any) -> str:
    """An ``_id`` as lossless canonical Extended JSON (stored in the offsets)."""
    return json_util.dumps({"k": value}, json_options=_CANONICAL)


def decode_key(text: str) -> Any:
    return json_util.loads(text, json_options=_CANONICAL)["k"]


def _require_bracket(value: Any) -> int:
    bracket = bracket_of(value)
    if bracket is None:
        raise ValueError(f"an _id range cannot be bounded by {value!r} ({type(value).__name__})")
    return bracket


def plan_ranges(collection: Collection[Any], split_size: int, *, count: int | None = None) -> list[IdRange]:
    """Split ``collection`` into ranges of about ``split_size`` documents (one range when smaller).

    Boundaries are quantiles of a random sample of ``_id`` values that the server sorts in its own
    order (``$sample`` reads random documents without scanning the collection); a boundary of a type
    that cannot bound a range (MinKey, regex, code, …) merges its range into the previous one.
    ``split_size`` of 0 or less disables splitting.
    """
    total = collection.estimated_document_count() if count is None else count
    if split_size <= 0 or total <= split_size:
        return [IdRange()]
    parts = min(math.ceil(total / split_size), MAX_RANGES)
    size = min(total, parts * SAMPLES_PER_RANGE)
    sample = [
        doc["_id"]
        for doc in collection.aggregate(
            [{"$sample": {"size": size}}, {"$project": {"_id": 1}}, {"$sort": {"_id": 1}}], allowDiskUse=True
        )
    ]
    step = len(sample) / parts
    bounds: list[Any] = []
    seen: set[str] = set()
    for k in range(1, parts):
        value = sample[int(k * step)]
        identity = encode_key(value)
        if bracket_of(value) is not None and identity not in seen:  # a sample may repeat a key
            seen.add(identity)
            bounds.append(value)
    if not bounds:
        return [IdRange()]
    # The outer ranges end at the smallest and largest _id that exist now (an index lookup each), so
    # no range has to name whole type brackets that hold nothing. A key outside them inserted later
    # comes after the snapshot's start position, so the stream delivers it.
    lowest = _extreme(collection, 1)
    highest = _extreme(collection, -1)
    ranges = [IdRange(lowest, bounds[0])]
    ranges += [IdRange(low, high) for low, high in zip(bounds, bounds[1:], strict=False)]
    ranges.append(IdRange(bounds[-1], highest, high_inclusive=highest is not None))
    return ranges


def _extreme(collection: Collection[Any], direction: int) -> Any:
    """The smallest (1) or largest (-1) ``_id`` when it can bound a range, else None (unbounded)."""
    found = collection.find_one({}, {"_id": 1}, sort=[("_id", direction)])
    value = None if found is None else found["_id"]
    return value if bracket_of(value) is not None else None
