"""Many concurrent clients, from several processes and threads, against one server."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from pymongo import MongoClient
from pymongo.database import Database

WRITERS = 3
DOCS_PER_WRITER = 200


def _writer(uri: str, db_name: str, worker: int) -> int:
    """Insert, update and read back from a separate process; returns what this worker saw."""
    client: MongoClient = MongoClient(uri, serverSelectionTimeoutMS=20_000)
    with client:
        coll = client[db_name].shared
        coll.insert_many([{"_id": f"{worker}-{i}", "w": worker, "n": i} for i in range(DOCS_PER_WRITER)])
        for i in range(0, DOCS_PER_WRITER, 10):
            coll.update_one({"_id": f"{worker}-{i}"}, {"$inc": {"hits": 1}})
        return coll.count_documents({"w": worker})


def test_clients_in_several_processes(mongo_uri: str, fresh_db: Database) -> None:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=WRITERS, mp_context=context) as pool:
        seen = list(pool.map(_writer, [mongo_uri] * WRITERS, [fresh_db.name] * WRITERS, range(WRITERS)))
    assert seen == [DOCS_PER_WRITER] * WRITERS
    assert fresh_db.shared.count_documents({}) == WRITERS * DOCS_PER_WRITER
    assert fresh_db.shared.count_documents({"hits": 1}) == WRITERS * DOCS_PER_WRITER // 10


def test_threads_share_a_client_and_cursors_interleave(mongo_client: MongoClient, fresh_db: Database) -> None:
    fresh_db.c.insert_many([{"_id": i} for i in range(500)])

    def drain(batch: int) -> list[int]:
        return [d["_id"] for d in fresh_db.c.find().batch_size(batch)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(drain, [3, 7, 11, 50, 101, 200, 499, 1000]))
    assert all(r == list(range(500)) for r in results)
