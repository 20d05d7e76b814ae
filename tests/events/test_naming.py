"""Topic names come from one strategy: the converter, the config and the Dagster translator agree."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mongocdc_core.config import ConfigError, ConnectorConfig
from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.naming import (
    ENTRY_POINT_GROUP,
    UNICODE_STRATEGY,
    DefaultUnicodeTopicNamingStrategy,
    TopicNamingError,
    TopicNamingStrategy,
    TopicSettings,
    strategy_class,
)
from mongocdc_core.events.options import EventOptions
from mongocdc_core.positions import Position
from mongocdc_dagster.assets.cdc import collection_props
from mongocdc_dagster.discovery import DiscoveryState
from mongocdc_dagster.settings import CdcSettings
from mongocdc_dagster.translator import MongoCdcTranslator

BASE = {"mongodb.connection.string": "mongodb://h/?replicaSet=rs0", "topic.prefix": "shop"}


class UpperStrategy(TopicNamingStrategy):
    """A user strategy: upper-case collection topics under the prefix."""

    def data_change_topic(self, db: str, collection: str) -> str:
        return self.sanitize(f"{self.settings.prefix}-{db}-{collection}".upper())


class NotAStrategy:
    pass


def _insert(db: str, coll: str) -> dict[str, object]:
    return {"_id": {"_data": "00"}, "operationType": "insert", "ns": {"db": db, "coll": coll},
            "documentKey": {"_id": 1}, "fullDocument": {"_id": 1}, "clusterTime": None}


def _converter_topic(cfg: ConnectorConfig, db: str, coll: str) -> str:
    (record,) = EventConverter(EventOptions.from_config(cfg)).convert_change(_insert(db, coll), Position(1, 1))
    return record.topic


@pytest.mark.parametrize("delimiter", [".", "_", "-"])
def test_converter_config_and_translator_name_the_same_topic(delimiter: str, tmp_path: Path) -> None:
    properties = {**BASE, "topic.delimiter": delimiter}
    cfg = ConnectorConfig(properties)
    settings = CdcSettings.resolve(connector_properties=properties, home=str(tmp_path), environ={})
    namespace = "inv.my coll$x"
    props = collection_props("slices", namespace, cfg, settings, DiscoveryState.of([namespace]))
    meta = MongoCdcTranslator().get_asset_spec(props).metadata
    expected = f"shop{delimiter}inv{delimiter}my_coll_x"
    assert cfg.data_topic("inv", "my coll$x") == expected
    assert _converter_topic(cfg, "inv", "my coll$x") == expected
    assert meta["mongocdc/topic"] == expected


_VALID = st.text(alphabet="abcXYZ019._-", min_size=1, max_size=20).filter(lambda s: s not in (".", ".."))


@given(_VALID, _VALID)
def test_default_strategy_keeps_valid_names_as_they_were(db: str, coll: str) -> None:
    cfg = ConnectorConfig(BASE)
    # What config.data_topic produced before the naming function existed.
    assert cfg.data_topic(db, coll) == re.sub(r"[^A-Za-z0-9._-]", "_", f"shop.{db}.{coll}")


def test_unicode_strategy_escapes_underscore_and_invalid_characters() -> None:
    cfg = ConnectorConfig({**BASE, "topic.naming.strategy": UNICODE_STRATEGY, "topic.prefix": "my_shop"})
    assert cfg.data_topic("inv", "my coll$x") == "my_u005fshop.inv.my_u0020coll_u0024x"
    # Two collections that the default strategy would merge stay apart.
    assert cfg.data_topic("inv", "a b") != cfg.data_topic("inv", "a_b")
    assert _converter_topic(cfg, "inv", "a_b") == "my_u005fshop.inv.a_u005fb"
    # Debezium pads only short codes (Integer.toHexString): U+00E9 -> _u00e9, U+4E2D -> _u4e2d.
    assert DefaultUnicodeTopicNamingStrategy(TopicSettings("p")).data_change_topic("d", "é中") == "p.d._u00e9_u4e2d"
    # Heartbeat and transaction topics are joined, not sanitised, as in Debezium.
    assert cfg.transaction_topic() == "my_shop.transaction"
    assert cfg.heartbeat_topic() == "__debezium-heartbeat.my_shop"


def test_long_names_are_cut_at_kafkas_limit() -> None:
    topic = ConnectorConfig(BASE).data_topic("db", "c" * 400)
    assert len(topic) == 249 and topic.startswith("shop.db.ccc")


def test_user_strategy_by_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = [
        metadata.EntryPoint("upper", f"{__name__}:UpperStrategy", ENTRY_POINT_GROUP),
        metadata.EntryPoint("broken", f"{__name__}:NotAStrategy", ENTRY_POINT_GROUP),
        metadata.EntryPoint("missing", "no_such_module_here:Thing", ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(metadata, "entry_points", lambda group: [e for e in entries if e.group == group])
    cfg = ConnectorConfig({**BASE, "topic.naming.strategy": "upper"})
    assert cfg.data_topic("inv", "orders") == "SHOP-INV-ORDERS"
    assert _converter_topic(cfg, "inv", "orders") == "SHOP-INV-ORDERS"
    for name, reason in (("broken", "not a subclass"), ("missing", "cannot load"), ("nope", "unknown strategy")):
        with pytest.raises(ConfigError) as info:
            ConnectorConfig({**BASE, "topic.naming.strategy": name})
        assert info.value.properties == ("topic.naming.strategy",) and reason in str(info.value)


def test_schema_strategies_are_refused_with_the_reason() -> None:
    with pytest.raises(TopicNamingError, match="schema parts"):
        strategy_class("io.debezium.schema.SchemaTopicNamingStrategy")
    with pytest.raises(ValueError, match="unknown strategy"):
        EventOptions(topic_prefix="p", topic_naming_strategy="io.example.Missing")
