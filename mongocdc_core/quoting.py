"""Bounded quoting: how much of a bad value a message, log line or notification may carry.

A value a user or a document supplied can be megabytes long. Messages quote a prefix long enough
to recognise it and say how much was left out, so no log line floods a terminal and no
notification grows past what a Kafka message may hold.
"""

from __future__ import annotations

#: How much of a bad value a message quotes.
QUOTE_LIMIT = 200
#: The longest reason or message text a notification, log line or error carries.
TEXT_LIMIT = 2000


def quote(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to ``limit`` characters, saying how much was left out."""
    text = value if isinstance(value, str) else None
    if text is not None and len(text) > limit:
        return f"{text[:limit]!r}... ({len(text) - limit} more characters)"
    shown = repr(value)
    if len(shown) > limit:
        return f"{shown[:limit]}... ({len(shown) - limit} more characters)"
    return shown


def bounded(text: str, limit: int = TEXT_LIMIT) -> str:
    """``text`` itself when short enough, else its first ``limit`` characters and how many were left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"
