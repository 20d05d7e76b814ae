"""Event conversion throughput against a decode-and-dump baseline run in the same process.

Generates ~100k realistic change stream documents (inserts, updates with updateLookup, replaces,
deletes) as BSON, then measures:

  (a) baseline: ``bson.decode`` + ``json_util.dumps`` of the whole change document
      (and, for reference, ``bson.decode`` + ``orjson.dumps`` with json_util's default hook);
  (b) ``bson.decode`` + ``EventConverter.convert_change`` to serialized key/value bytes
      (default options: change_streams_update_full, schemas enabled, tombstones on).

Prints the rates and the ratio b/a (target: >= 0.5).
"""

from __future__ import annotations

import datetime
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bson
import orjson
from bson import json_util
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mongocdc_core.events.convert import EventConverter  # noqa: E402
from mongocdc_core.events.options import EventOptions  # noqa: E402
from mongocdc_core.positions import Position  # noqa: E402

N_EVENTS = 100_000
FIRST_NAMES = ["Anne", "Sally", "George", "Edward", "Zoë", "Mårten", "Li", "Kenji"]
CITIES = ["Springfield", "Shelbyville", "Ogdenville", "North Haverbrook"]


def _document(rng: random.Random, doc_id: ObjectId, now: datetime.datetime) -> dict[str, Any]:
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
        "created": now - datetime.timedelta(seconds=rng.randrange(10_000_000)),
        "address": {"street": f"{rng.randrange(999)} Main St", "city": rng.choice(CITIES), "zip": "12345"},
        "tags": [rng.choice(["vip", "new", "churn", "beta"]) for _ in range(rng.randrange(4))],
        "orders": [
            {"sku": f"SKU-{rng.randrange(100)}", "qty": rng.randrange(1, 5)} for _ in range(rng.randrange(3))
        ],
    }


def generate(n: int, seed: int = 7) -> list[tuple[bytes, Position]]:
    """Raw BSON change events with their positions."""
    rng = random.Random(seed)
    now = datetime.datetime(2024, 5, 1, 12, 0, 0)
    # A pool of varied documents, re-keyed per event, keeps generation quick.
    pool = [_document(rng, ObjectId(), now) for _ in range(2_000)]
    lsid = {"id": Binary(rng.randbytes(16), 4), "uid": Binary(rng.randbytes(32), 0)}
    ids: list[ObjectId] = []
    out = []
    for i in range(n):
        ts = Timestamp(1_714_564_800 + i // 10, i % 10 + 1)
        roll = rng.random()
        base: dict[str, Any] = {
            "_id": {"_data": f"82{ts.time:08X}{ts.inc:08X}2B022C0100296E5A1004"},
            "clusterTime": ts,
            "wallTime": now + datetime.timedelta(milliseconds=i),
            "ns": {"db": "inventory", "coll": f"customers{i % 5}"},
        }
        if roll < 0.5 or not ids:
            doc_id = ObjectId()
            ids.append(doc_id)
            doc = {**rng.choice(pool), "_id": doc_id}
            event = {**base, "operationType": "insert", "documentKey": {"_id": doc_id}, "fullDocument": doc}
        elif roll < 0.85:
            doc_id = rng.choice(ids)
            doc = {**rng.choice(pool), "_id": doc_id}
            event = {
                **base,
                "operationType": "update",
                "documentKey": {"_id": doc_id},
                "updateDescription": {
                    "updatedFields": {"email": doc["email"], "address.city": doc["address"]["city"]},
                    "removedFields": ["phone"] if rng.random() < 0.2 else [],
                    "truncatedArrays": [],
                },
                "fullDocument": doc,
            }
        elif roll < 0.9:
            doc_id = rng.choice(ids)
            event = {
                **base,
                "operationType": "replace",
                "documentKey": {"_id": doc_id},
                "fullDocument": {**rng.choice(pool), "_id": doc_id},
            }
        else:
            event = {**base, "operationType": "delete", "documentKey": {"_id": rng.choice(ids)}}
        if rng.random() < 0.05:
            event["lsid"] = lsid
            event["txnNumber"] = Int64(i)
        out.append((bson.encode(event), Position(ts.time, ts.inc)))
    return out


def _measure(events: list[tuple[bytes, Position]], step: Callable[[bytes, Position], Any]) -> float:
    """Events per second of ``step`` over all events (CPU time of this process, so other load on
    the machine does not skew the ratios)."""
    start = time.process_time()
    for raw, pos in events:
        step(raw, pos)
    return len(events) / (time.process_time() - start)


def main() -> None:
    console = Console()
    t0 = time.perf_counter()
    events = generate(int(sys.argv[1]) if len(sys.argv) > 1 else N_EVENTS)
    console.print(f"generated {len(events):,} change events in {time.perf_counter() - t0:.1f}s")

    def default(obj: Any) -> Any:
        return json_util.default(obj, json_util.LEGACY_JSON_OPTIONS)

    decode = bson.decode
    converter = EventConverter(EventOptions(topic_prefix="bench", rs="rs0"))
    baseline = _measure(events, lambda raw, pos: json_util.dumps(decode(raw)))
    orjson_ref = _measure(
        events,
        lambda raw, pos: orjson.dumps(decode(raw), default=default, option=orjson.OPT_PASSTHROUGH_DATETIME),
    )
    converted = _measure(events, lambda raw, pos: converter.convert_change(decode(raw), pos))

    table = Table(title=f"event conversion, {len(events):,} events")
    table.add_column("measurement")
    table.add_column("events/s", justify="right")
    table.add_column("ratio to (a)", justify="right")
    table.add_row("(a) bson.decode + json_util.dumps", f"{baseline:,.0f}", "1.00")
    table.add_row(
        "    bson.decode + orjson.dumps(default=json_util)",
        f"{orjson_ref:,.0f}",
        f"{orjson_ref / baseline:.2f}",
    )
    table.add_row(
        "(b) bson.decode + EventConverter.convert_change", f"{converted:,.0f}", f"{converted / baseline:.2f}"
    )
    console.print(table)
    console.print(
        f"ratio b/a = {converted / baseline:.2f} (target >= 0.5); b vs orjson reference = {converted / orjson_ref:.2f}"
    )


if __name__ == "__main__":
    main()
