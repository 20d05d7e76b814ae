"""How fast pymongo drains a large ``find`` from the emulator, against a same-process baseline.

Starts the emulator as a separate process (as mongod would be; on a 2-core machine the server and
the client then each get a core), inserts N documents with ``insert_many`` and drains
``find({})`` through pymongo. Baseline, in this process: ``bson.decode_all`` over the same
documents pre-encoded in 101-document batches, i.e. the client's unavoidable decoding work with
no server and no network. The ratio says which fraction of the pure decoding speed the emulator
delivers end to end, independent of the machine.

Usage: ``python benchmarks/bench_emulator_find.py [--docs 200000]``
"""

from __future__ import annotations

import argparse
import time

import bson
from bson import ObjectId
from pymongo import MongoClient
from rich.console import Console
from rich.table import Table

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200_000)
    args = parser.parse_args()
    docs = _documents(args.docs)
    with EmulatedReplicaSet(in_process=False, noop_interval=0, oplog_size_mb=1024) as rs:
        insert_rate, find_rate = _drain(rs.uri, docs)
    for doc in docs:
        doc.pop("_id", None)
    baseline = _baseline(_documents(args.docs))
    table = Table(title=f"emulator find, {args.docs:,} documents")
    table.add_column("measure")
    table.add_column("docs/s", justify="right")
    table.add_row("baseline: bson.decode_all of the same documents (same process)", f"{baseline:,.0f}")
    table.add_row("emulator: find({}) drained through pymongo", f"{find_rate:,.0f}")
    table.add_row("emulator: insert_many (for reference)", f"{insert_rate:,.0f}")
    console = Console()
    console.print(table)
    console.print(f"ratio find / baseline: {find_rate / baseline:.2f}")


if __name__ == "__main__":
    main()
