"""The connection string and secrets: reading URI options, masking what must never be shown."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, unquote

_SECRET_WORDS = ("password", "secret", "jaas", "token", "credential")
MASK = "********"


def is_secret(prop: str) -> bool:
    """Whether a property's value must be masked wherever it is shown."""
    lowered = prop.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def mask_connection_string(uri: str) -> str:
    """Hide the password in `mongodb://user:pass@host`."""
    return re.sub(r"^(mongodb(?:\+srv)?://[^:/@]*:)[^@/]*@", lambda m: m.group(1) + MASK + "@", uri)


def uri_parts(uri: str) -> tuple[bool, dict[str, str]]:
    """Whether the URI carries credentials, and its options keyed by lower-case name."""
    rest = uri.split("://", 1)[1] if "://" in uri else uri
    authority, _, tail = rest.partition("/")
    if "?" in authority:
        authority, _, query = authority.partition("?")
    else:
        query = tail.partition("?")[2]
    has_user = "@" in authority
    options = {k.lower(): unquote(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    return has_user, options
