"""The demo's inventory data set and scripted workload (customers, products, orders).

Used by ``make demo`` and ``make dev`` to give the local stack realistic data: documents carry
most BSON types (ObjectId, Decimal128, Int64, dates, binary, UUID, nested documents and arrays),
and the workload exercises every kind of change a capture must follow, including a transaction.
"""

from __future__ import annotations

import datetime
import random
import uuid
from collections.abc import Callable
from typing import Any

from bson import Binary, Decimal128, Int64, ObjectId
from bson.binary import UuidRepresentation
from pymongo import MongoClient

DATABASE = "inventory"
COLLECTIONS = ("customers", "products", "orders")


def _customer(i: int) -> dict[str, Any]:
    return {
        "_id": 1000 + i,
        "first_name": random.choice(["Sally", "George", "Edward", "Anne", "Zoë", "Jürgen"]),
        "last_name": random.choice(["Thomas", "Bailey", "Walker", "Kretchmar", "Ōtsuka"]),
        "email": f"customer{i}@example.com",
        "since": datetime.datetime(2020, 1, 1) + datetime.timedelta(days=i),
        "address": {"city": random.choice(["Berlin", "Lyon", "Osaka"]), "zip": f"{10000 + i}"},
        "tags": ["new"] if i % 3 else ["vip", "early"],
        "external_id": Binary.from_uuid(uuid.UUID(int=i + 1), UuidRepresentation.STANDARD),
    }


def _product(i: int) -> dict[str, Any]:
    return {
        "_id": f"sku-{i:04d}",
        "name": f"product {i}",
        "price": Decimal128(f"{1 + i % 50}.{i % 100:02d}"),
        "stock": Int64(100 + i),
        "weight_kg": 0.25 * (1 + i % 8),
        "dimensions": {"w": i % 7, "h": i % 5, "d": [1, 2, 3]},
        "discontinued": False,
        "thumbnail": Binary(bytes([i % 256]) * 8),
    }


def _order(i: int, customers: int, products: int) -> dict[str, Any]:
    lines = [
        {"sku": f"sku-{(i * 7 + n) % products:04d}", "quantity": 1 + n, "price": Decimal128(f"{2 + n}.50")}
        for n in range(1 + i % 3)
    ]
    return {
        "_id": ObjectId(),
        "customer": 1000 + i % customers,
        "placed_at": datetime.datetime(2024, 5, 1) + datetime.timedelta(minutes=i),
        "lines": lines,
        "status": "placed",
        "note": None,
    }


def seed(
    client: MongoClient[Any], customers: int = 200, products: int = 100, orders: int = 500, database: str = DATABASE
) -> dict[str, int]:
    """Create the inventory collections (dropping old ones) and return their sizes."""
    random.seed(7)
    db = client[database]
    for name in COLLECTIONS:
        db.drop_collection(name)
    db.customers.insert_many([_customer(i) for i in range(customers)])
    db.products.insert_many([_product(i) for i in range(products)])
    db.orders.insert_many([_order(i, customers, products) for i in range(orders)])
    return {name: db[name].count_documents({}) for name in COLLECTIONS}


def run_workload(
    client: MongoClient[Any], steps: int = 200, pause: Callable[[], None] | None = None, database: str = DATABASE
) -> dict[str, int]:
    """A scripted mix of inserts, updates, replaces, deletes and transactions; returns counts."""
    rng = random.Random(11)
    db = client[database]
    counts = {"insert": 0, "update": 0, "replace": 0, "delete": 0, "transaction": 0}
    customer_ids = [doc["_id"] for doc in db.customers.find({}, {"_id": 1})]
    next_customer = max(customer_ids) + 1
    for step in range(steps):
        kind = step % 10
        if kind in (0, 1):
            db.customers.insert_one({**_customer(next_customer - 1000), "tags": ["workload"]})
            customer_ids.append(next_customer)
            next_customer += 1
            counts["insert"] += 1
        elif kind in (2, 3, 4):
            target = rng.choice(customer_ids)
            db.customers.update_one(
                {"_id": target},
                {"$set": {"address.city": rng.choice(["Paris", "Kyoto"]), "updated": True}, "$push": {"tags": "touched"}},
            )
            db.products.update_one({"_id": f"sku-{rng.randrange(100):04d}"}, {"$inc": {"stock": -1}, "$unset": {"thumbnail": ""}})
            counts["update"] += 2
        elif kind == 5:
            target = rng.choice(customer_ids)
            db.customers.replace_one({"_id": target}, {"first_name": "Replaced", "last_name": str(step), "tags": []})
            counts["replace"] += 1
        elif kind == 6:
            target = customer_ids.pop(rng.randrange(len(customer_ids)))
            db.customers.delete_one({"_id": target})
            counts["delete"] += 1
        elif kind == 7:
            db.products.update_one({"_id": f"sku-{rng.randrange(100):04d}"}, {"$pop": {"dimensions.d": 1}})
            counts["update"] += 1
        else:
            with client.start_session() as session, session.start_transaction():
                sku = f"sku-{rng.randrange(100):04d}"
                db.orders.insert_one(
                    {"_id": ObjectId(), "customer": rng.choice(customer_ids), "lines": [{"sku": sku, "quantity": 1}],
                     "status": "placed", "placed_at": datetime.datetime(2025, 1, 1)},
                    session=session,
                )
                db.products.update_one({"_id": sku}, {"$inc": {"stock": -1}}, session=session)
            counts["transaction"] += 1
        if pause is not None:
            pause()
    return counts
