"""Password leakage: no secret from the configuration appears in any output the connector writes.

Secrets sit in ``mongodb.password``, in the connection string, and in pass-through properties
(``producer.override.*``, ``signal.consumer.*``). The runs cover refused credentials (code 18), a
configuration error next to the secrets, and a complete run at DEBUG log level with the metrics file,
notifications and signals on. Nothing the runs leave behind (log, stdout/stderr, offsets, metrics,
records, notifications) may contain a secret.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import Source
from tests.reliability.harness import (
    Connector,
    Figures,
    cluster_time,
    connector_properties,
    grep_files,
    stop_at_arg,
    write_config,
)

pytestmark = pytest.mark.reliability


def _with_password_in_uri(uri: str, user: str, password: str) -> str:
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{user}:{password}@{rest}"


def test_no_password_in_any_output(source: Source, tmp_path: Path, report: Callable[[Figures], None]) -> None:
    secrets = {name: f"S3cr3t-{name}-{uuid.uuid4().hex}" for name in ("property", "uri", "producer", "jaas", "bad")}
    db = source.fresh_db()
    db.load.insert_many([{"_id": i} for i in range(5)])
    runs: list[tuple[str, dict[str, object], int]] = [
        ("credentials refused (mongodb.password)", {"mongodb.user": "cdc", "mongodb.password": secrets["property"],
                                                    "connect.max.attempts": 1, "errors.max.retries": 0}, 4),
        ("credentials refused (connection string)", {
            "mongodb.connection.string": _with_password_in_uri(source.uri, "cdc", secrets["uri"]),
            "connect.max.attempts": 1, "errors.max.retries": 0}, 4),
        ("configuration error next to the secrets", {"mongodb.user": "cdc", "mongodb.password": secrets["bad"],
                                                     "snapshot.mode": "sometimes"}, 2),
        ("complete run, DEBUG log, metrics, notifications", {
            "producer.override.ssl.key.password": secrets["producer"],
            "signal.consumer.sasl.jaas.config": f'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                                f'username="u" password="{secrets["jaas"]}";',
            "notification.enabled.channels": "sink,log", "notification.sink.topic.name": "rel-notifications",
            "signal.data.collection": f"{db.name}.signals"}, 0),
    ]
    codes = []
    connector: Connector | None = None
    for index, (_, extra, _) in enumerate(runs):
        config = write_config(tmp_path / f"connector-{index}.json", connector_properties(source.uri, db.name, **extra))
        connector = Connector(config, f"jsonl:{tmp_path / 'out'}", str(tmp_path / "offsets.json"), tmp_path)
        codes.append(connector.run("--stop-at", stop_at_arg(cluster_time(source.client)), "--log-level", "DEBUG",
                                   "--metrics-file", str(tmp_path / "metrics-cli.json")))
    assert connector is not None
    # The complete run again, streaming signals that produce notifications (a log signal, a rejected one).
    db.signals.insert_many([{"type": "log", "data": {"message": "hello"}}, {"type": "no-such-signal"}])
    db.load.insert_one({"_id": "streamed"})
    codes.append(connector.run("--stop-at", stop_at_arg(cluster_time(source.client)), "--log-level", "DEBUG",
                               "--metrics-file", str(tmp_path / "metrics-cli.json")))
    configs = {p for p in tmp_path.glob("connector-*.json")}
    leaks = [(path, needle) for path, needle in grep_files(tmp_path, secrets.values()) if path not in configs]
    outputs = [p for p in tmp_path.rglob("*") if p.is_file() and p not in configs]
    report(Figures("password leakage", peak_rss_mb=connector.peak_rss_mb,
                   note=f"{len(secrets)} secrets, {len(codes)} runs (exit {codes}), {len(outputs)} files searched, "
                        f"leaks={len(leaks)}"))
    source.client.drop_database(db.name)
    assert codes == [*(expected for *_, expected in runs), 0], connector.tail()
    assert leaks == []
    assert (tmp_path / "metrics-cli.json").exists() and (tmp_path / "out" / "rel-notifications.jsonl").exists()
