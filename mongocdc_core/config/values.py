"""Turning one property's string into its typed value, with a readable reason when it cannot be."""

from __future__ import annotations

import re
from typing import Any

from bson import json_util

from mongocdc_core.config.errors import Invalid, suggest
from mongocdc_core.config.specs import INT64_MAX, INTEGER, PropertySpec

# The aggregation stages MongoDB accepts in a change stream pipeline (after $changeStream).
CHANGE_STREAM_STAGES = ("$addFields", "$match", "$project", "$replaceRoot", "$replaceWith", "$redact", "$set",
                        "$unset")
# Prometheus label names: the tags become labels of every metric, next to the exporter's own labels.
_TAG_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
RESERVED_METRIC_LABELS = ("plugin", "context", "server", "task", "table")


def split_list(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def split_regex_list(value: str) -> tuple[str, ...]:
    """Split on commas that are not escaped and not inside (), [] or {} so `a{1,3}` stays whole."""
    items: list[str] = []
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    current: list[str] = []
    escaped = False
    for ch in value:
        if escaped:
            current.append(ch)
            escaped = False
            continue
        if ch == "\\":
            current.append(ch)
            escaped = True
            continue
        if ch in depth and not (ch != "[" and depth["["]):
            depth[ch] += 1
        elif ch in closing and depth[closing[ch]] > 0 and not (ch != "]" and depth["["]):
            depth[closing[ch]] -= 1
        if ch == "," and not any(depth.values()):
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    items.append("".join(current))
    return tuple(item.strip() for item in items if item.strip())


def convert(spec: PropertySpec, raw: str | None) -> Any:
    """Convert a raw string (None = unset) to the typed value, raising Invalid with a readable reason."""
    text = raw.strip() if raw is not None else None
    if text is None or (text == "" and spec.kind in ("str", "password", "int", "enum", "bool")):
        text = spec.default
    kind = spec.kind
    if kind in ("str", "password"):
        return text or None
    if kind == "bool":
        assert text is not None
        if text.lower() not in ("true", "false"):
            raise Invalid(f"expected true or false, got {text!r}")
        return text.lower() == "true"
    if kind == "int":
        assert text is not None
        if not INTEGER.match(text):
            raise Invalid(f"expected an integer, got {text!r}")
        number = int(text)
        if spec.minimum is not None and number < spec.minimum:
            raise Invalid(f"must be >= {spec.minimum}, got {number}")
        maximum = INT64_MAX if spec.maximum is None else spec.maximum
        if number > maximum:
            raise Invalid(f"must be <= {maximum}, got {number}")
        return number
    if kind == "enum":
        assert text is not None
        value = text.lower()
        if value not in spec.allowed:
            raise Invalid(f"{text!r} is not one of {', '.join(spec.allowed)}{suggest(value, spec.allowed)}")
        return value
    text = text or ""
    if kind in ("list", "filter_list"):
        return split_list(text)
    if kind == "regex_list":
        return split_regex_list(text)
    if kind == "channels":
        items = split_list(text)
        for item in items:
            if item.lower() not in spec.allowed:
                raise Invalid(
                    f"unknown channel {item!r}; known channels: {', '.join(spec.allowed)}"
                    f"{suggest(item.lower(), spec.allowed)}"
                )
        return tuple(item.lower() for item in items)
    if kind == "operations":
        ops = {item.lower() for item in split_list(text)}
        unknown = sorted(ops - {"c", "u", "d", "t", "none"})
        if unknown:
            raise Invalid(f"unknown operation(s) {', '.join(unknown)}; use c, u, d, t or none")
        if "none" in ops and len(ops) > 1:
            raise Invalid("'none' cannot be combined with other operations")
        return frozenset(ops - {"none"})
    if kind == "pipeline":
        return _parse_pipeline(text)
    if kind == "tags":
        return parse_tags(text) if text.strip() else {}
    raise AssertionError(f"unhandled property kind {kind}")


def _parse_pipeline(text: str) -> list[dict[str, Any]]:
    if not text:
        return []
    try:
        stages = json_util.loads(text)
    except ValueError as exc:
        raise Invalid(f"is not valid JSON ({exc})") from None
    if not isinstance(stages, list) or not all(isinstance(stage, dict) for stage in stages):
        raise Invalid("must be a JSON array of pipeline stage objects, e.g. [{\"$match\": {...}}]")
    for number, stage in enumerate(stages, 1):
        if len(stage) != 1:
            raise Invalid(f"stage {number} must have exactly one operator, got {sorted(stage) or 'none'}")
        operator = next(iter(stage))
        if operator not in CHANGE_STREAM_STAGES:
            raise Invalid(
                f"stage {number} uses {operator!r}, which a change stream does not allow; allowed stages: "
                f"{', '.join(CHANGE_STREAM_STAGES)}{suggest(operator, CHANGE_STREAM_STAGES)}"
            )
    return stages


def parse_tags(text: str) -> dict[str, str]:
    """``custom.metric.tags`` as Debezium reads it: ``k1=v1,k2=v2``, each key once, none empty."""
    tags: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value or "=" in value:
            raise Invalid(f"expected key=value pairs separated by commas, got {item.strip()!r}")
        if not _TAG_KEY.fullmatch(key):
            raise Invalid(f"tag name {key!r} must start with a letter and use only letters, digits and '_'")
        if key in tags:
            raise Invalid(f"tag {key!r} is given twice")
        if key in RESERVED_METRIC_LABELS:
            raise Invalid(f"tag {key!r} is set by the connector itself (reserved: {', '.join(RESERVED_METRIC_LABELS)})")
        tags[key] = value
    return tags
