"""How fast pymongo drains a large ``find`` from the emulator, against a same-process baseline.

Starts the emulator as a separate process (as mongod would be; on a 2-core machine the server and
the client then each get a core), inserts N documents with ``insert_many`` and drains
``find({})`` through pymongo. Baseline, in this process: ``bson.decode_all`` over the same
documents pre-encoded in 101-document batches, i.e. the client's unavoidable decoding work with
no server and no network. The ratio says which fraction of the pure decoding speed the emulator
delivers end to end, independent of the machine.

Usage: ``python -m benchmarks.bench_emulator_find`` (``MONGOCDC_BENCH_SMALL=1``: 5,000 documents)
"""

from __future__ import annotations

import time

import bson
from bson import ObjectId
from pymongo import MongoClient

from benchmarks import harness
from mongocdc_devstack.fixture import EmulatedReplicaSet


def _documents(count: int) -> list[dict[str, object]]:
    return [
        {"_id": ObjectId(), "name": f"customer-{i}", "value": i * 3, "score": i / 7, "tags": ["a", "b"],
         "address": {"city": "Lyon", "zip": f"{69000 + i % 9}"}}  # fmt: skip
        for i in range(count)
    ]


def _baseline(docs: list[dict[str, object]]) -> float:
    """Docs/s of decoding the same documents from BSON in 101-document batches."""
    batches = [b"".join(bson.encode(d) for d in docs[i : i + 101]) for i in range(0, len(docs), 101)]
    start = time.perf_counter()
    seen = 0
    for batch in batches:
        for _ in bson.decode_all(batch):
            seen += 1
    elapsed = time.perf_counter() - start
    assert seen == len(docs)
    return seen / elapsed


def _drain(uri: str, docs: list[dict[str, object]]) -> tuple[float, float]:
    """(insert docs/s, find docs/s) through pymongo."""
    client: MongoClient = MongoClient(uri)
    with client:
        coll = client.bench.find
        coll.drop()
        start = time.perf_counter()
        coll.insert_many(docs, ordered=False)
        insert_rate = len(docs) / (time.perf_counter() - start)
        start = time.perf_counter()
        seen = sum(1 for _ in coll.find({}))
        find_rate = seen / (time.perf_counter() - start)
        assert seen == len(docs), f"drained {seen} of {len(docs)} documents"
        return insert_rate, find_rate


NAME = "emulator find"
BASELINE = "bson.decode_all of the same documents pre-encoded in 101-document batches (the client's decoding alone)"


def run(small: bool) -> list[harness.Row]:
    count = 5_000 if small else 200_000
    docs = _documents(count)
    with EmulatedReplicaSet(in_process=False, noop_interval=0, oplog_size_mb=1024) as rs:
        insert_rate, find_rate = _drain(rs.uri, docs)
    baseline = _baseline(_documents(count))
    return [
        harness.Row(NAME, "emulator find({}) drained through pymongo", BASELINE, find_rate, baseline, "docs/s",
                    find_rate / baseline),
        harness.Row(NAME, "emulator insert_many (reference)", BASELINE, insert_rate, baseline, "docs/s",
                    insert_rate / baseline),
    ]


if __name__ == "__main__":
    harness.main(NAME, BASELINE, run)
