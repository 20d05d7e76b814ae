"""Pure conversion of MongoDB change stream documents into Debezium-compatible records."""

from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.records import Record

__all__ = ["EventConverter", "EventOptions", "Record"]
