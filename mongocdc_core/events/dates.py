"""Time since the epoch of a decoded BSON date: the one computation every record format makes of dates."""

from __future__ import annotations

import datetime

from bson.datetime_ms import DatetimeMS
from bson.tz_util import utc as _BSON_UTC

_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
# The engine's client decodes dates tz-aware with bson's own ``utc``; Python subtracts two datetimes
# that share a tzinfo object without calling it, which is what makes this epoch worth keeping
# (an aware subtraction otherwise calls the Python-level ``utcoffset`` twice: 2.5 times the cost).
_EPOCH_BSON_UTC = datetime.datetime(1970, 1, 1, tzinfo=_BSON_UTC)


def since_epoch(value: datetime.datetime) -> datetime.timedelta:
    """``value`` minus 1970-01-01T00:00Z; a naive datetime is UTC (as ``bson.decode`` returns it)."""
    tz = value.tzinfo
    if tz is None:
        return value - _EPOCH
    return value - (_EPOCH_BSON_UTC if tz is _BSON_UTC else _EPOCH_UTC)


def datetime_ns(value: datetime.datetime) -> int:
    """Nanoseconds since the epoch (naive datetimes are UTC)."""
    delta = since_epoch(value)
    return ((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds) * 1_000


def datetime_millis(value: datetime.datetime | DatetimeMS) -> int:
    """Milliseconds since the epoch of a BSON date (a DatetimeMS holds a date outside Python's range)."""
    if isinstance(value, DatetimeMS):
        return int(value)
    delta = since_epoch(value)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
