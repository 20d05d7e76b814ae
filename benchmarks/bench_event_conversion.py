"""Event conversion: raw change-stream BSON -> Debezium record bytes, against decode + orjson.dumps.

Four workloads of realistic change events (customer documents with ObjectId, Int64, Decimal128,
dates, nested documents and arrays), each as BSON in 100-event batches the way a ``getMore``
returns them: inserts, updates (``updateDescription`` plus the looked-up ``fullDocument``),
deletes (with their tombstones) and transactions (inserts carrying ``lsid``/``txnNumber``, with
``provide.transaction.metadata`` so BEGIN/END records are written too). Each is converted in the
default format, in ``mongocdc.event.format=debezium_3x`` and in ``oplog_1x``, with the Kafka Connect
schema part on and off, and (schema part on) with field rules (:data:`FIELD_RULES`).

Baseline (same process, same batches): ``bson.decode_all`` of each batch plus
``orjson.dumps(event, default=bson.json_util.default)`` of every decoded event, i.e. a bare loop
that decodes the change stream and writes each event as JSON with the libraries' own tools.
Measured: what the connector's change stream does with the batch (``bson.decode_all`` with its
document class, ``RawChange``: one undecoded event each) plus ``EventConverter.convert_change`` of
every event.
Both in process CPU time, in five rounds that interleave baseline and conversion; the ratio is connector events/s over baseline
events/s, the median of the rounds' ratios (goal >= 0.9 in every format).

Usage: ``python -m benchmarks.bench_event_conversion`` (``MONGOCDC_BENCH_SMALL=1`` for CI size)
"""

from __future__ import annotations

import datetime
import random
import statistics
from collections.abc import Callable
from typing import Any

import bson
import orjson
from bson import json_util
from bson.binary import Binary
from bson.codec_options import CodecOptions
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from benchmarks import harness
from mongocdc_core.events.convert import EventConverter
from mongocdc_core.events.options import EventOptions
from mongocdc_core.events.raw import RawChange
from mongocdc_core.positions import Position

NAME = "event conversion"
BASELINE = (
    "bson.decode_all of the same 100-event BSON batches + orjson.dumps(event, default=bson.json_util.default) "
    "per event (CPU time, median of 5 interleaved rounds)"
)
BATCH = 100
WORKLOADS = ("inserts", "updates", "deletes", "transactions")
FIRST_NAMES = ["Anne", "Sally", "George", "Edward", "Zoë", "Mårten", "Li", "Kenji"]
CITIES = ["Springfield", "Shelbyville", "Ogdenville", "North Haverbrook"]
NOW = datetime.datetime(2024, 5, 1, 12, 0, 0, tzinfo=datetime.UTC)


def document(rng: random.Random, doc_id: ObjectId) -> dict[str, Any]:
    """One document of the benchmarks' customer shape (every common BSON type, nested and arrays)."""
    name = rng.choice(FIRST_NAMES)
    return {
        "_id": doc_id,
        "first_name": name,
        "last_name": f"Kretchmar{rng.randrange(1000)}",
        "email": f"{name.lower()}@example.org",
        "age": rng.randrange(18, 90),
        "score": rng.random() * 100,
        "visits": Int64(rng.randrange(1 << 40)),
        "active": rng.random() < 0.8,
        "price": Decimal128(f"{rng.randrange(10_000)}.{rng.randrange(100):02d}"),
        "created": NOW - datetime.timedelta(seconds=rng.randrange(10_000_000)),
        "address": {"street": f"{rng.randrange(999)} Main St", "city": rng.choice(CITIES), "zip": "12345"},
        "tags": [rng.choice(["vip", "new", "churn", "beta"]) for _ in range(rng.randrange(4))],
        "orders": [{"sku": f"SKU-{rng.randrange(100)}", "qty": rng.randrange(1, 5)} for _ in range(rng.randrange(3))],
    }


def generate(workload: str, count: int, seed: int = 7) -> list[tuple[bytes, list[Position]]]:
    """``count`` raw change events of one workload, as BSON batches with each event's position."""
    rng = random.Random(seed)
    lsid = {"id": Binary(rng.randbytes(16), 4), "uid": Binary(rng.randbytes(32), 0)}
    events: list[tuple[bytes, Position]] = []
    for i in range(count):
        ts = Timestamp(1_714_564_800 + i // 10, i % 10 + 1)
        doc_id = ObjectId()
        event: dict[str, Any] = {
            "_id": {"_data": f"82{ts.time:08X}{ts.inc:08X}2B022C0100296E5A1004"},
            "clusterTime": ts,
            "wallTime": NOW + datetime.timedelta(milliseconds=i),
            "ns": {"db": "inventory", "coll": "customers"},
            "documentKey": {"_id": doc_id},
        }
        if workload in ("inserts", "transactions"):
            event |= {"operationType": "insert", "fullDocument": document(rng, doc_id)}
            if workload == "transactions":
                event |= {"lsid": lsid, "txnNumber": Int64(i // 50)}  # transactions of 50 inserts
        elif workload == "updates":
            doc = document(rng, doc_id)
            event |= {
                "operationType": "update",
                "updateDescription": {
                    "updatedFields": {"email": doc["email"], "address.city": doc["address"]["city"], "visits": doc["visits"]},
                    "removedFields": ["phone"] if rng.random() < 0.2 else [],
                    "truncatedArrays": [],
                },
                "fullDocument": doc,
            }
        else:
            event |= {"operationType": "delete"}
        events.append((bson.encode(event), Position(ts.time, ts.inc)))
    return [
        (b"".join(raw for raw, _ in events[i : i + BATCH]), [pos for _, pos in events[i : i + BATCH]])
        for i in range(0, len(events), BATCH)
    ]


#: The change stream's codec: each event of a batch an undecoded RawChange.
STREAM_OPTIONS: CodecOptions[RawChange] = CodecOptions(document_class=RawChange)
PLAIN_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions()


def _cpu_rate(
    batches: list[tuple[bytes, list[Position]]],
    handle: Callable[[Any, Position], object],
    options: CodecOptions[Any] = PLAIN_OPTIONS,
) -> float:
    """Events/s (CPU) of decoding every batch with ``options`` and handling each event."""
    count = sum(len(positions) for _, positions in batches)
    decode_all = bson.decode_all

    def work() -> None:
        for raw, positions in batches:
            for doc, position in zip(decode_all(raw, options), positions, strict=True):
                handle(doc, position)

    return count / harness.cpu_seconds(work)


def baseline_handle(doc: dict[str, Any], position: Position) -> bytes:
    return orjson.dumps(doc, default=json_util.default)


#: The formats measured: mongocdc's default, the released Debezium 3.x bytes and the 1.x oplog format.
FORMATS = ("change_streams", "debezium_3x", "oplog_1x")
#: Field rules of the rows that have them: an exclusion inside a nested document, two renames (one
#: inside the documents of an array).
FIELD_RULES: dict[str, tuple[str, ...]] = {
    "field_exclude_list": ("inventory.customers.address.zip",),
    "field_renames": ("inventory.customers.email:mail", "inventory.customers.orders.qty:quantity"),
}


def run(small: bool) -> list[harness.Row]:
    count = 2_000 if small else 40_000
    rows = []
    for workload in WORKLOADS:
        batches = generate(workload, count)
        # (format, schemas, field rules): each format with the schema part on and off, and with rules
        variants = [(f, schemas, rules) for f in FORMATS for schemas, rules in ((True, False), (False, False), (True, True))]
        converters = [
            EventConverter(EventOptions(topic_prefix="bench", rs="rs0", schemas_enable=schemas, event_format=event_format,
                                        provide_transaction_metadata=workload == "transactions",
                                        **(FIELD_RULES if rules else {})))
            for event_format, schemas, rules in variants
        ]  # fmt: skip
        # Rounds interleave the baseline and every conversion, so a change in the machine's load
        # weighs on all alike; the figures are the medians of the per-round values.
        rounds: list[tuple[float, list[float]]] = []
        for _ in range(5):
            base = _cpu_rate(batches, baseline_handle)
            rounds.append((base, [_cpu_rate(batches, conv.convert_change, STREAM_OPTIONS) for conv in converters]))
        base = statistics.median(r[0] for r in rounds)
        for index, (event_format, schemas, rules) in enumerate(variants):
            rate = statistics.median(r[1][index] for r in rounds)
            ratio = statistics.median(r[1][index] / r[0] for r in rounds)
            label = "" if event_format == "change_streams" else f"{event_format}, "
            extra = ", field rules" if rules else ""
            rows.append(harness.Row(
                "conversion", f"{label}{workload}, schemas {'on' if schemas else 'off'}{extra}", BASELINE,
                rate, base, "events/s", ratio, 0.9,
            ))  # fmt: skip
    return rows


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
