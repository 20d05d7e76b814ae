"""Reading and writing connector configs as text: Java ``.properties`` and Kafka Connect JSON values.

Kafka Connect hands every property to a connector as a string; JSON configs may carry numbers and
booleans, which are turned into the exact strings Kafka Connect would produce.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

from bson import json_util

from mongocdc_core.config.errors import ConfigError

_PROP_WS = " \t\f"
_UNESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _natural_lines(text: str) -> list[str]:
    # Only \n, \r and \r\n end a line in Java's properties format (str.splitlines splits on more).
    return re.split(r"\r\n|\r|\n", text)


def _logical_lines(text: str) -> Iterator[str]:
    pending: str | None = None
    for line in _natural_lines(text):
        stripped = line.lstrip(_PROP_WS)
        if pending is None:
            if not stripped or stripped[0] in "#!":
                continue
        elif not stripped:
            yield pending
            pending = None
            continue
        trailing = len(stripped) - len(stripped.rstrip("\\"))
        if trailing % 2 == 1:
            pending = (pending or "") + stripped[:-1]
            continue
        yield (pending or "") + stripped
        pending = None
    if pending is not None:
        yield pending


def _unescape(raw: str, line: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(raw):
        ch = raw[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        if i + 1 >= len(raw):
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt == "u":
            digits = raw[i + 2 : i + 6]
            if len(digits) != 4 or not re.fullmatch(r"[0-9A-Fa-f]{4}", digits):
                raise ConfigError([("<properties>", f"malformed \\uxxxx escape in line {line!r}")])
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_UNESCAPES.get(nxt, nxt))
        i += 2
    # Java builds strings from UTF-16 units; join escaped surrogate pairs into one code point.
    try:
        return "".join(out).encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError:
        raise ConfigError([("<properties>", f"unpaired surrogate escape in line {line!r}")]) from None


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java `.properties` text: `#`/`!` comments, `=`, `:` or blank separators, `\\` continuations."""
    result: dict[str, str] = {}
    for line in _logical_lines(text):
        key_end = len(line)
        value_start = len(line)
        has_sep = False
        backslash = False
        for i, ch in enumerate(line):
            if not backslash and ch in "=:":
                key_end, value_start, has_sep = i, i + 1, True
                break
            if not backslash and ch in _PROP_WS:
                key_end, value_start = i, i + 1
                break
            backslash = (ch == "\\") and not backslash
        while value_start < len(line):
            ch = line[value_start]
            if ch not in _PROP_WS:
                if not has_sep and ch in "=:":
                    has_sep = True
                else:
                    break
            value_start += 1
        result[_unescape(line[:key_end], line)] = _unescape(line[value_start:], line)
    return result


def _escape(text: str, is_key: bool) -> str:
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\t\n\r\f":
            out.append("\\" + {"\t": "t", "\n": "n", "\r": "r", "\f": "f"}[ch])
        elif ch == " " and (is_key or i == 0):
            out.append("\\ ")
        elif ch in "=:#!":
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def dump_properties(properties: Mapping[str, str]) -> str:
    """Write properties in Java `.properties` syntax that `parse_properties` reads back unchanged."""
    return "".join(f"{_escape(k, True)}={_escape(v, False)}\n" for k, v in properties.items())


def scalar_to_str(prop: str, value: object) -> str | None:
    """Turn a JSON/Python scalar into the string Kafka Connect would see; None means unset."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return str(value)
    if prop == "cursor.pipeline" and isinstance(value, list):
        return json_util.dumps(value)
    raise ConfigError([(prop, f"expected a string or scalar value, got {type(value).__name__}")])

