"""Topic names: Debezium's topic naming strategies, the one place every topic name comes from.

The converter, the configuration and the Dagster translator all ask a :class:`TopicNamingStrategy`,
so a collection gets the same topic everywhere. ``topic.naming.strategy`` names one of Debezium's
strategies that apply to the MongoDB connector, or a user class registered under the entry-point
group ``mongocdc.topic_naming`` (its entry-point name is the property value).

Debezium's MongoDB collection ids have database parts (``<db>``, ``<collection>``) and no schema
parts, so of Debezium's built-in strategies only the two "default" ones name a topic per collection:

* ``DefaultTopicNamingStrategy``: ``<prefix><delimiter><db><delimiter><collection>``; every character
  a Kafka topic name cannot hold (anything but letters, digits, ``.``, ``_`` and ``-``) becomes ``_``.
* ``DefaultUnicodeTopicNamingStrategy``: the same parts, but each invalid character and each ``_``
  becomes ``_u`` plus its UTF-16 code in hex (``$`` -> ``_u0024``), so distinct names stay distinct.

Both sanitise the whole name, delimiter included, and cut it at Kafka's 249 characters; the
heartbeat and transaction topics are joined with the delimiter and not sanitised, as in Debezium.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import metadata

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "mongocdc.topic_naming"
MAX_TOPIC_LENGTH = 249
DEFAULT_STRATEGY = "io.debezium.schema.DefaultTopicNamingStrategy"
UNICODE_STRATEGY = "io.debezium.schema.DefaultUnicodeTopicNamingStrategy"
# Debezium's strategies that name topics from schema parts: a MongoDB collection has none, so every
# collection would land on the bare prefix topic.
SCHEMA_STRATEGIES = ("io.debezium.schema.SchemaTopicNamingStrategy",
                     "io.debezium.schema.SchemaUnicodeTopicNamingStrategy")


class TopicNamingError(ValueError):
    """``topic.naming.strategy`` names nothing usable; the message says what is accepted."""


@dataclass(frozen=True, slots=True)
class TopicSettings:
    """The ``topic.*`` properties a strategy reads."""

    prefix: str
    delimiter: str = "."
    heartbeat_prefix: str = "__debezium-heartbeat"
    transaction: str = "transaction"


class TopicNamingStrategy:
    """Debezium's ``DefaultTopicNamingStrategy``; subclass it (and register the subclass under
    ``mongocdc.topic_naming``) to name topics differently."""

    def __init__(self, settings: TopicSettings) -> None:
        self.settings = settings

    def data_change_topic(self, db: str, collection: str) -> str:
        """The topic of a collection's change events."""
        s = self.settings
        return self.sanitize(s.delimiter.join(part for part in (s.prefix, db, collection) if part.strip()))

    def heartbeat_topic(self) -> str:
        """``<topic.heartbeat.prefix><delimiter><topic.prefix>``."""
        return f"{self.settings.heartbeat_prefix}{self.settings.delimiter}{self.settings.prefix}"

    def transaction_topic(self) -> str:
        """``<topic.prefix><delimiter><topic.transaction>``."""
        return f"{self.settings.prefix}{self.settings.delimiter}{self.settings.transaction}"

    def valid_character(self, ch: str) -> bool:
        """Whether ``ch`` may stay as it is in a topic name."""
        return ch in "._-" or ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ("0" <= ch <= "9")

    def replacement(self, ch: str) -> str:
        """What an invalid character (one UTF-16 code unit) becomes."""
        return "_"

    def sanitize(self, name: str) -> str:
        """``name`` with invalid characters replaced, never ``.``/``..``, at most 249 characters."""
        if all(self.valid_character(ch) for ch in name) and len(name) <= MAX_TOPIC_LENGTH and name not in (".", ".."):
            return name
        units = name.encode("utf-16-le", "surrogatepass")
        chars = [units[i:i + 2].decode("utf-16-le", "surrogatepass") for i in range(0, len(units), 2)]
        out = "".join(ch if self.valid_character(ch) else self.replacement(ch) for ch in chars)
        if len(out) > MAX_TOPIC_LENGTH:
            out = out[:MAX_TOPIC_LENGTH]
        elif out in (".", ".."):
            out = self.replacement(".") * len(out)
        log.debug("topic name %r is not a valid Kafka topic name, using %r", name, out)
        return out


class DefaultUnicodeTopicNamingStrategy(TopicNamingStrategy):
    """Debezium's ``DefaultUnicodeTopicNamingStrategy``: ``_`` is the escape character, so it and every
    invalid character become ``_u<hex>`` and two different collections never share a topic."""

    def valid_character(self, ch: str) -> bool:
        return ch != "_" and super().valid_character(ch)

    def replacement(self, ch: str) -> str:
        # Debezium pads only one- and two-digit codes (Integer.toHexString, then "00" in front).
        code = f"{ord(ch):x}"
        return "_u" + ("00" + code if len(code) <= 2 else code)


BUILT_IN_STRATEGIES: dict[str, type[TopicNamingStrategy]] = {
    DEFAULT_STRATEGY: TopicNamingStrategy,
    UNICODE_STRATEGY: DefaultUnicodeTopicNamingStrategy,
}


def strategy_class(name: str) -> type[TopicNamingStrategy]:
    """The class ``topic.naming.strategy`` names: a built-in Debezium name, or an entry-point name in
    ``mongocdc.topic_naming`` whose object is a :class:`TopicNamingStrategy` subclass."""
    if name in BUILT_IN_STRATEGIES:
        return BUILT_IN_STRATEGIES[name]
    known = ", ".join(BUILT_IN_STRATEGIES)
    if name in SCHEMA_STRATEGIES:
        raise TopicNamingError(
            f"{name} names topics from schema parts, which MongoDB collections do not have (every collection "
            f"would share the topic <topic.prefix>); use {known}"
        )
    entries = [e for e in metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == name]
    if not entries:
        raise TopicNamingError(
            f"unknown strategy {name!r}: use {known}, or the name of a class registered under the "
            f"{ENTRY_POINT_GROUP!r} entry-point group"
        )
    try:
        loaded = entries[0].load()
    except Exception as exc:  # a broken plugin is the user's error: name it instead of a traceback
        raise TopicNamingError(f"cannot load {name!r} ({entries[0].value}): {type(exc).__name__}: {exc}") from exc
    if not (isinstance(loaded, type) and issubclass(loaded, TopicNamingStrategy)):
        raise TopicNamingError(
            f"{name!r} ({entries[0].value}) is not a subclass of mongocdc_core.events.naming.TopicNamingStrategy"
        )
    return loaded


def topic_naming(name: str, settings: TopicSettings) -> TopicNamingStrategy:
    """The configured strategy, ready to name topics."""
    return strategy_class(name)(settings)
