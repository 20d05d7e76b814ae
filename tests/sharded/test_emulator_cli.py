"""``mongocdc emulator --shards N [--layout FILE]``: the emulated sharded cluster from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pymongo import MongoClient

from mongocdc_devstack.fixture import EmulatedShardedCluster, free_ports

pytestmark = pytest.mark.skipif(bool(os.environ.get("MONGOCDC_TEST_MONGODB_SHARDED_URI")), reason="the emulator's own command line")


def test_cluster_from_the_command_line_with_a_layout(tmp_path: Path) -> None:
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps({"databases": {"shop": "shard1"},
                                  "collections": {"shop.orders": {"key": {"_id": 1},
                                                                  "chunks": [{"max": 100, "shard": "shard0"}, {"shard": "shard1"}]}}}))  # fmt: skip
    port = free_ports(3)  # the mongos and the two shards after it
    process = subprocess.Popen([sys.executable, "-m", "mongocdc_core.cli", "emulator", "--port", str(port), "--shards", "2",
                                "--layout", str(layout), "--noop-interval", "0.5", "--dbpath", str(tmp_path / "data")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line and process.stderr is not None:
            pytest.fail(f"the emulator exited before listening: {process.stderr.read()}")
        assert f"listening on 127.0.0.1:{port} (mongos; shard0 on 127.0.0.1:{port + 1}, shard1 on 127.0.0.1:{port + 2})" in line
        client: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port}/", serverSelectionTimeoutMS=10_000)
        client.shop.orders.insert_many([{"_id": 1}, {"_id": 500}])
        client.shop.notes.insert_one({"_id": "n"})
        shard0: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port + 1}/?replicaSet=shard0")
        shard1: MongoClient = MongoClient(f"mongodb://127.0.0.1:{port + 2}/?replicaSet=shard1")
        assert [d["_id"] for d in shard0.shop.orders.find()] == [1]
        assert [d["_id"] for d in shard1.shop.orders.find()] == [500]
        assert shard1.shop.notes.count_documents({}) == 1  # the database's primary shard
        chunks = list(client.config.chunks.find({}, {"_id": 0, "shard": 1, "max": 1}))
        assert chunks[0] == {"max": {"_id": 100}, "shard": "shard0"} and chunks[1]["shard"] == "shard1"
        for c in (client, shard0, shard1):
            c.close()
    finally:
        process.terminate()
        process.wait(timeout=30)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()
    # The data and the routing survive a restart from the same dbpath.
    with EmulatedShardedCluster(port=port, dbpath=str(tmp_path / "data"), in_process=False) as again:
        client = MongoClient(again.uri, serverSelectionTimeoutMS=10_000)
        assert sorted(d["_id"] for d in client.shop.orders.find()) == [1, 500]
        client.shop.orders.insert_one({"_id": 50})
        shard0 = MongoClient(again.shard_uri("shard0"))
        assert sorted(d["_id"] for d in shard0.shop.orders.find()) == [1, 50]
        client.close()
        shard0.close()


@pytest.mark.parametrize(("layout", "message"), [
    ({"collections": {"a.b": {"shard": "shard9"}}}, "collection a.b: unknown shard 'shard9' (shards: shard0, shard1)"),
    ({"collections": {"a.b": {"key": {"_id": "hashed"}, "chunks": [{"shard": "shard0"}]}}}, "hashed keys are not supported"),
    ({"collections": {"a.b": {"key": {"_id": 1}, "chunks": [{"max": 5, "shard": "shard0"}, {"max": 1, "shard": "shard1"},
                                                            {"shard": "shard0"}]}}}, "chunk bounds must ascend"),
    ({"nodes": {}}, "a layout is a JSON object with 'databases' and/or 'collections'"),
])  # fmt: skip
def test_bad_layout_is_one_clear_line(tmp_path: Path, layout: dict[str, object], message: str) -> None:
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(layout))
    done = subprocess.run([sys.executable, "-m", "mongocdc_devstack.server", "--port", "0", "--shards", "2", "--layout", str(path)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1 and done.stderr.startswith(f"--layout {path}: ")


def test_layout_without_shards_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mongocdc_devstack.server", "--port", "0", "--layout", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and "--layout needs --shards" in done.stderr
