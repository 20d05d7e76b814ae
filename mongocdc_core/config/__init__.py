"""Connector configuration: Debezium MongoDB property names, defaults and validation.

The package is split by concern: ``specs`` declares every property, ``codec`` reads and writes
``.properties`` text, ``values`` converts one value, ``validators`` holds one rule per function,
``filters`` decides which collections are captured, and ``connector`` is the typed
:class:`ConnectorConfig` everything else reads. Import from here.
"""

from mongocdc_core.config.codec import dump_properties, parse_properties
from mongocdc_core.config.connector import ConnectorConfig
from mongocdc_core.config.errors import ConfigError
from mongocdc_core.config.filters import CollectionFilters
from mongocdc_core.config.specs import (
    BUILT_IN_DATABASES,
    CONNECTOR_CLASS,
    NOTIFICATION_CHANNELS,
    PASS_THROUGH_PREFIXES,
    PROPERTIES,
    PROPERTY_SPECS,
    SIGNAL_CHANNELS,
    PropertySpec,
)
from mongocdc_core.config.values import CHANGE_STREAM_STAGES

__all__ = [
    "BUILT_IN_DATABASES",
    "CHANGE_STREAM_STAGES",
    "CONNECTOR_CLASS",
    "NOTIFICATION_CHANNELS",
    "PASS_THROUGH_PREFIXES",
    "PROPERTIES",
    "PROPERTY_SPECS",
    "SIGNAL_CHANNELS",
    "CollectionFilters",
    "ConfigError",
    "ConnectorConfig",
    "PropertySpec",
    "dump_properties",
    "parse_properties",
]
