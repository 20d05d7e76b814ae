"""Where the stream stands, stored durably: the offset model and its stores (file, memory, Kafka).

The engine saves an offset only after the sink's ``flush`` returned for every record before it,
so a stored offset never points past an undelivered record (at-least-once). ``open_offset_store``
turns an ``--offsets`` specification into a store; the Kafka store lives in ``offsets.kafka``.
"""

from mongocdc_core.offsets.factory import OFFSET_FORMS, open_offset_store
from mongocdc_core.offsets.file import FileOffsetStore, MemoryOffsetStore
from mongocdc_core.offsets.model import Offset, OffsetError, OffsetStore, SnapshotState

__all__ = [
    "OFFSET_FORMS",
    "FileOffsetStore",
    "MemoryOffsetStore",
    "Offset",
    "OffsetError",
    "OffsetStore",
    "SnapshotState",
    "open_offset_store",
]
