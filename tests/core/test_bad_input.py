"""The bad-input corpus: every malformed configuration and signal gets one clear refusal, before anything starts.

Configurations go through ``mongocdc run`` (its ``main()`` in-process, and a few as real subprocesses):
each must exit non-zero, name the offending property and show no traceback, without connecting to
anything (the connection string points at a port where nothing listens, so a config that slipped
through would hang or fail differently). Signals go through the engine's signal processor: each must
be rejected with a notification naming the signal field, and a log line, never a traceback.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from mongocdc_core.cli import main as cli_main
from mongocdc_core.source.signals import (
    CHANNEL_FILE,
    CHANNEL_KAFKA,
    CHANNEL_SOURCE,
    REASON_LIMIT,
    LogNotifier,
    SignalProcessor,
)

BASE = {
    "connector.class": "io.debezium.connector.mongodb.MongoDbConnector",
    "mongodb.connection.string": "mongodb://127.0.0.1:1/?replicaSet=rs0",
    "topic.prefix": "shop",
}
REPO = Path(__file__).resolve().parents[2]

# (case id, properties merged over BASE (None removes one), text the refusal must contain (the property)).
CONFIGS: list[tuple[str, Mapping[str, str | None], str]] = [
    ("uri-port-out-of-range", {"mongodb.connection.string": "mongodb://127.0.0.1:99999/?replicaSet=rs0"},
     "mongodb.connection.string"),
    ("uri-unknown-option", {"mongodb.connection.string": "mongodb://h/?replicaSet=rs0&bogusOption=1"},
     "mongodb.connection.string"),
    ("uri-bad-tls-value", {"mongodb.connection.string": "mongodb://h/?tls=maybe"}, "mongodb.connection.string"),
    ("uri-wrong-scheme", {"mongodb.connection.string": "postgres://h/db"}, "mongodb.connection.string"),
    ("uri-missing", {"mongodb.connection.string": None}, "mongodb.connection.string"),
    ("uri-empty-host", {"mongodb.connection.string": "mongodb:///?replicaSet=rs0"}, "mongodb.connection.string"),
    ("uri-port-not-a-number", {"mongodb.connection.string": "mongodb://h:port/"}, "mongodb.connection.string"),
    ("uri-srv-unknown-option", {"mongodb.connection.string": "mongodb+srv://h.example.net/?bogus=1"},
     "mongodb.connection.string"),
    ("tls-contradiction", {"mongodb.ssl.enabled": "true",
                           "mongodb.connection.string": "mongodb://h/?replicaSet=rs0&tls=false"},
     "mongodb.ssl.enabled"),
    ("ssl-contradiction", {"mongodb.ssl.enabled": "true", "mongodb.connection.string": "mongodb://h/?ssl=false"},
     "mongodb.ssl.enabled"),
    ("pipeline-out", {"cursor.pipeline": '[{"$out": "x"}]'}, "cursor.pipeline"),
    ("pipeline-merge", {"cursor.pipeline": '[{"$merge": {"into": "x"}}]'}, "cursor.pipeline"),
    ("pipeline-group", {"cursor.pipeline": '[{"$match": {}}, {"$group": {"_id": 1}}]'}, "cursor.pipeline"),
    ("pipeline-lookup", {"cursor.pipeline": '[{"$lookup": {"from": "x"}}]'}, "cursor.pipeline"),
    ("pipeline-two-operators", {"cursor.pipeline": '[{"$match": {}, "$project": {}}]'}, "cursor.pipeline"),
    ("pipeline-not-json", {"cursor.pipeline": "[{$match"}, "cursor.pipeline"),
    ("pipeline-object", {"cursor.pipeline": '{"$match": {}}'}, "cursor.pipeline"),
    ("snapshot-list-outside-captured", {"collection.include.list": "inv\\.orders",
                                        "snapshot.include.collection.list": "inv.customers"},
     "snapshot.include.collection.list"),
    ("snapshot-list-outside-scope", {"capture.scope": "database", "capture.target": "inv",
                                     "snapshot.include.collection.list": "other.orders"},
     "snapshot.include.collection.list"),
    ("snapshot-list-bad-regex", {"snapshot.include.collection.list": "inv.(orders"},
     "snapshot.include.collection.list"),
    ("kafka-typo", {"mongocdc.kafka.exactly.onse": "true"}, "mongocdc.kafka.exactly.onse"),
    ("kafka-unknown", {"mongocdc.kafka.bootstrap.servers": "h:9092"}, "mongocdc.kafka.bootstrap.servers"),
    ("kafka-partitions-zero", {"mongocdc.kafka.topic.partitions": "0"}, "mongocdc.kafka.topic.partitions"),
    ("kafka-replication-zero", {"mongocdc.kafka.topic.replication.factor": "0"},
     "mongocdc.kafka.topic.replication.factor"),
    ("kafka-cleanup-policy", {"mongocdc.kafka.topic.cleanup.policy": "forever"},
     "mongocdc.kafka.topic.cleanup.policy"),
    ("kafka-exactly-once-yes", {"mongocdc.kafka.exactly.once": "yes"}, "mongocdc.kafka.exactly.once"),
    ("kafka-txn-timeout-small", {"mongocdc.kafka.transaction.timeout.ms": "10"},
     "mongocdc.kafka.transaction.timeout.ms"),
    ("mongocdc-typo", {"mongocdc.metrics.prot": "9404"}, "mongocdc.metrics.prot"),
    ("metrics-port-range", {"mongocdc.metrics.port": "70000"}, "mongocdc.metrics.port"),
    ("metrics-port-text", {"mongocdc.metrics.port": "http"}, "mongocdc.metrics.port"),
    ("metric-tags-malformed", {"custom.metric.tags": "env"}, "custom.metric.tags"),
    ("metric-tags-reserved", {"custom.metric.tags": "server=x"}, "custom.metric.tags"),
    ("source-struct-v1", {"source.struct.version": "v1"}, "source.struct.version"),
    ("source-struct-v3", {"source.struct.version": "v3"}, "source.struct.version"),
    ("naming-strategy-unknown", {"topic.naming.strategy": "com.example.Nope"}, "topic.naming.strategy"),
    ("naming-strategy-schema", {"topic.naming.strategy": "io.debezium.schema.SchemaTopicNamingStrategy"},
     "topic.naming.strategy"),
    ("topic-prefix-missing", {"topic.prefix": None}, "topic.prefix"),
    ("topic-prefix-invalid", {"topic.prefix": "shop orders"}, "topic.prefix"),
    ("topic-delimiter-invalid", {"topic.delimiter": "/"}, "topic.delimiter"),
    ("topic-transaction-invalid", {"topic.transaction": "tx$"}, "topic.transaction"),
    ("unknown-property", {"snapshot.modee": "initial"}, "snapshot.modee"),
    ("renamed-1x-property", {"mongodb.hosts": "rs0/h:27017"}, "mongodb.hosts"),
    ("connector-class", {"connector.class": "io.debezium.connector.mysql.MySqlConnector"}, "connector.class"),
    ("auth-class", {"mongodb.authentication.class": "com.example.Auth"}, "mongodb.authentication.class"),
    ("password-without-user", {"mongodb.password": "pw"}, "mongodb.password"),
    ("bool-invalid", {"tombstones.on.delete": "maybe"}, "tombstones.on.delete"),
    ("int-invalid", {"max.batch.size": "lots"}, "max.batch.size"),
    ("int-below-minimum", {"max.batch.size": "0"}, "max.batch.size"),
    ("int-too-large", {"poll.interval.ms": str(2**64)}, "poll.interval.ms"),
    ("enum-invalid", {"snapshot.mode": "sometimes"}, "snapshot.mode"),
    ("capture-mode-invalid", {"capture.mode": "oplog"}, "capture.mode"),
    ("queue-not-larger-than-batch", {"max.batch.size": "100", "max.queue.size": "100"}, "max.queue.size"),
    ("backoff-inverted", {"connect.backoff.initial.delay.ms": "5000", "connect.backoff.max.delay.ms": "1000"},
     "connect.backoff.initial.delay.ms"),
    ("skip-without-threshold", {"cursor.oversize.handling.mode": "skip"}, "cursor.oversize.skip.threshold"),
    ("include-and-exclude", {"collection.include.list": "a.b", "collection.exclude.list": "a.c"},
     "collection.exclude.list"),
    ("bad-include-regex", {"database.include.list": "inv("}, "database.include.list"),
    ("field-rename-form", {"field.renames": "inv.orders:x"}, "field.renames"),
    ("field-exclude-form", {"field.exclude.list": "orders.total"}, "field.exclude.list"),
    ("custom-mode-without-name", {"snapshot.mode": "custom"}, "snapshot.mode.custom.name"),
    ("scope-database-without-target", {"capture.scope": "database"}, "capture.target"),
    ("scope-collection-bad-target", {"capture.scope": "collection", "capture.target": "inv"}, "capture.target"),
    ("signal-collection-form", {"signal.data.collection": "signals"}, "signal.data.collection"),
    ("signal-channel-unknown", {"signal.enabled.channels": "source,carrier-pigeon"}, "signal.enabled.channels"),
    ("kafka-signal-without-servers", {"signal.enabled.channels": "kafka"}, "signal.kafka.bootstrap.servers"),
    ("sink-notification-without-topic", {"notification.enabled.channels": "sink"}, "notification.sink.topic.name"),
    ("skipped-operations", {"skipped.operations": "c,x"}, "skipped.operations"),
    ("filter-override-missing", {"snapshot.collection.filter.overrides": "inv.orders"},
     "snapshot.collection.filter.overrides.inv.orders"),
    ("filter-override-not-json", {"snapshot.collection.filter.overrides": "inv.orders",
                                  "snapshot.collection.filter.overrides.inv.orders": "status=1"},
     "snapshot.collection.filter.overrides.inv.orders"),
    # Megabytes of bad value: the refusal quotes a bounded prefix (checked for every case below).
    ("huge-enum-value", {"snapshot.mode": "x" * (2 * 1024 * 1024)}, "snapshot.mode"),
    ("huge-unknown-property", {"z" * (2 * 1024 * 1024): "1"}, "z" * 100),
    ("huge-uri-option", {"mongodb.connection.string": "mongodb://h/?replicaSet=rs0&bogus=" + "q" * (2 * 1024 * 1024)},
     "mongodb.connection.string"),
    ("huge-pipeline", {"cursor.pipeline": '[{"$out": "' + "p" * (2 * 1024 * 1024) + '"}]'}, "cursor.pipeline"),
    ("failure-mode-invalid", {"event.processing.failure.handling.mode": "ignore-all"},
     "event.processing.failure.handling.mode"),
]
#: No refusal is longer than this, whatever the size of the bad value.
MESSAGE_LIMIT = 16 * 1024


def _write(tmp_path: Path, props: Mapping[str, str | None], name: str = "connector.json") -> Path:
    merged: dict[str, str] = dict(BASE)
    for key, value in props.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    path = tmp_path / name
    path.write_text(json.dumps({"name": "shop", "config": merged}))
    return path


def _run_args(tmp_path: Path, config: Path) -> list[str]:
    return ["run", "--config", str(config), "--sink", f"jsonl:{tmp_path / 'out'}",
            "--offsets", str(tmp_path / "offsets.json"), "--no-progress"]


def _assert_refused(code: int, output: str, named: str) -> None:
    assert code != 0, output[:MESSAGE_LIMIT]
    assert named in output, output[:MESSAGE_LIMIT]
    assert "Traceback" not in output, output[:MESSAGE_LIMIT]
    assert len(output) < MESSAGE_LIMIT, output[:MESSAGE_LIMIT]


def test_the_corpus_is_large_enough() -> None:
    assert len(CONFIGS) >= 60 and len(SIGNALS) >= 30
    assert len({case for case, _, _ in CONFIGS}) == len(CONFIGS)


@pytest.mark.parametrize(("props", "named"), [(p, n) for _, p, n in CONFIGS], ids=[c for c, _, _ in CONFIGS])
def test_malformed_config_is_refused_by_mongocdc_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], props: Mapping[str, str | None], named: str
) -> None:
    code = cli_main(_run_args(tmp_path, _write(tmp_path, props)))
    captured = capsys.readouterr()
    _assert_refused(code, captured.out + captured.err, named)
    assert not (tmp_path / "out").exists() and not (tmp_path / "offsets.json").exists()  # nothing started


@pytest.mark.parametrize(("text", "named"), [
    ("{not json", "connector.json"),
    ('{"name": "shop", "config": {}, "extra": 1}', "extra"),
    ("[]", "connector.json"),
])
def test_malformed_config_files_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, named: str
) -> None:
    path = tmp_path / "connector.json"
    path.write_text(text)
    code = cli_main(_run_args(tmp_path, path))
    captured = capsys.readouterr()
    _assert_refused(code, captured.out + captured.err, named)


def test_bad_metrics_port_option_is_one_usage_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli_main([*_run_args(tmp_path, _write(tmp_path, {})), "--metrics-port", "99999"])
    captured = capsys.readouterr()
    _assert_refused(int(str(info.value.code)), captured.err, "--metrics-port")


@pytest.mark.parametrize("case", ["uri-port-out-of-range", "pipeline-out", "kafka-typo", "tls-contradiction"])
def test_malformed_config_is_refused_by_the_real_command(tmp_path: Path, case: str) -> None:
    props, named = next((p, n) for c, p, n in CONFIGS if c == case)
    config = _write(tmp_path, props, "connector.properties")
    merged = json.loads(config.read_text())["config"]
    config.write_text("".join(f"{k}={v}\n" for k, v in merged.items()))
    result = subprocess.run(
        [sys.executable, "-m", "mongocdc_core.cli", *_run_args(tmp_path, config)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    _assert_refused(result.returncode, result.stdout + result.stderr, named)


# -- signals ------------------------------------------------------------------------------------------------


class IdleSnapshots:
    """An incremental snapshotter with nothing running: pause, resume and stop have nothing to act on."""

    def start(self, signal_id: str, namespaces: Sequence[str], filters: Mapping[str, dict[str, Any]]) -> None:
        raise AssertionError(f"a malformed signal started a snapshot of {namespaces}")

    def stop(self, namespaces: Sequence[str] | None) -> list[str]:
        raise AssertionError("a malformed signal stopped a snapshot")

    def pause(self) -> bool:
        return False

    def resume(self) -> bool:
        return False

    def collections(self) -> list[str]:
        return []


def _doc(kind: object, data: object = None, **extra: object) -> dict[str, object]:
    doc: dict[str, object] = {"_id": "s1", "type": kind, **extra}
    if data is not None:
        doc["data"] = data
    return doc


def _exec(**data: object) -> dict[str, object]:
    return _doc("execute-snapshot", data)


HUGE = "x" * (15 * 1024 * 1024)

# (case id, a signaling-collection document or a JSON text from the file/Kafka channels, field the reason names).
SIGNALS: list[tuple[str, Mapping[str, object] | str, str]] = [
    ("type-missing", {"_id": "s1", "data": {}}, "'type'"),
    ("type-number", _doc(5), "'type'"),
    ("type-empty", _doc("  "), "'type'"),
    ("type-unknown", _doc("reboot"), "unknown signal type"),
    ("type-huge", _doc(HUGE), "unknown signal type"),
    ("data-not-json", _doc("execute-snapshot", "{broken"), "'data'"),
    ("data-array", _doc("execute-snapshot", [1, 2]), "'data'"),
    ("data-number", _doc("execute-snapshot", 7), "'data'"),
    ("collections-missing", _exec(), "'data-collections'"),
    ("collections-empty", _exec(**{"data-collections": []}), "'data-collections' is empty"),
    ("collections-string", _exec(**{"data-collections": "inv.a"}), "'data-collections'"),
    ("collections-numbers", _exec(**{"data-collections": [1, 2]}), "'data-collections'"),
    ("collections-blank-entry", _exec(**{"data-collections": [" "]}), "data-collections"),
    ("collections-bad-regex", _exec(**{"data-collections": ["inv.("]}), "data-collections entry"),
    ("collections-bad-quoting", _exec(**{"data-collections": ['"inv".orders']}), "data-collections entry"),
    ("collections-match-nothing", _exec(**{"data-collections": ["nowhere\\..*"]}), "match no captured collection"),
    ("collections-huge", _exec(**{"data-collections": [HUGE + "("]}), "data-collections entry"),
    ("snapshot-type-unknown", _exec(**{"data-collections": ["inv.a"], "type": "full"}), "snapshot type"),
    ("blocking-unavailable", _exec(**{"data-collections": ["inv.a"], "type": "blocking"}), "blocking"),
    ("conditions-not-array", _exec(**{"data-collections": ["inv.a"], "additional-conditions": {"a": 1}}),
     "'additional-conditions'"),
    ("condition-without-collection", _exec(**{"data-collections": ["inv.a"],
                                              "additional-conditions": [{"filter": "a=1"}]}), "'data-collection'"),
    ("condition-without-filter", _exec(**{"data-collections": ["inv.a"],
                                          "additional-conditions": [{"data-collection": "inv.a"}]}), "'filter'"),
    ("condition-outside-signal", _exec(**{"data-collections": ["inv.a"],
                                          "additional-conditions": [{"data-collection": "inv.b", "filter": "a=1"}]}),
     "not in data-collections"),
    ("condition-or", _exec(**{"data-collections": ["inv.a"],
                              "additional-conditions": [{"data-collection": "inv.a", "filter": "a=1 OR b=2"}]}),
     "cannot translate"),
    ("condition-sql", _exec(**{"data-collections": ["inv.a"],
                               "additional-conditions": [{"data-collection": "inv.a",
                                                          "filter": "SELECT * FROM a"}]}), "SQL statement"),
    ("condition-bad-json", _exec(**{"data-collections": ["inv.a"],
                                    "additional-conditions": [{"data-collection": "inv.a", "filter": "{a:"}]}),
     "filter"),
    ("condition-unterminated-quote", _exec(**{"data-collections": ["inv.a"],
                                              "additional-conditions": [{"data-collection": "inv.a",
                                                                         "filter": "a='open"}]}), "unterminated"),
    ("condition-huge-value", _exec(**{"data-collections": ["inv.a"],
                                      "additional-condition": "a=" + HUGE}), "filter"),
    ("stop-without-type", _doc("stop-snapshot", {"data-collections": ["inv.a"]}), "data.type"),
    ("stop-blocking", _doc("stop-snapshot", {"type": "blocking"}), "blocking snapshot cannot be stopped"),
    ("pause-nothing-running", _doc("pause-snapshot"), "nothing to pause"),
    ("resume-nothing-paused", _doc("resume-snapshot"), "nothing to resume"),
    ("log-without-message", _doc("log", {}), "data.message"),
    ("json-garbage", "{garbage", "not valid JSON"),
    ("json-array", "[1, 2]", "must be a JSON object"),
    ("json-huge-garbage", "{" + "y" * (2 * 1024 * 1024), "not valid JSON"),
]


@pytest.mark.parametrize(("signal", "field"), [(s, f) for _, s, f in SIGNALS], ids=[c for c, _, _ in SIGNALS])
def test_malformed_signal_is_rejected_with_a_notification(
    caplog: pytest.LogCaptureFixture, signal: Mapping[str, object] | str, field: str
) -> None:
    notifier = LogNotifier("shop")
    processor = SignalProcessor(IdleSnapshots(), notifier, lambda: ["inv.a", "inv.b"], connector_name="shop")
    with caplog.at_level(logging.INFO, logger="mongocdc.signals"):
        if isinstance(signal, str):
            processor.receive_json(signal, CHANNEL_KAFKA if len(signal) < 100 else CHANNEL_FILE, id="k-0-1")
        else:
            processor.receive_document(signal, CHANNEL_SOURCE)
        processor.process()
    assert processor.rejected == 1 and processor.processed == 0
    (notification,) = notifier.sent
    assert notification["aggregate_type"] == "Signal" and notification["type"] == "REJECTED"
    reason = notification["additional_data"]["reason"]
    assert field in reason
    assert len(reason) <= REASON_LIMIT + 40  # a bounded prefix of any bad value, never the value whole
    assert "Traceback" not in caplog.text
    assert any("skipping signal" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert max(len(r.getMessage()) for r in caplog.records) < 8 * 1024  # the 15 MiB value is never logged whole


def test_a_notification_quotes_only_a_bounded_prefix_of_a_huge_value(caplog: pytest.LogCaptureFixture) -> None:
    from mongocdc_core.config import ConnectorConfig
    from mongocdc_core.notifications import NotificationService

    cfg = ConnectorConfig.from_dict({**BASE, "notification.enabled.channels": "sink,log",
                                     "notification.sink.topic.name": "notes"})
    service = NotificationService(cfg)
    with caplog.at_level(logging.INFO):
        service.notify("Signal", "REJECTED", {"reason": "bad value " + "v" * (2 * 1024 * 1024)})
    (record,) = service.drain()
    assert record.value is not None and len(record.value) < MESSAGE_LIMIT  # far below any Kafka message limit
    assert "more characters" in service.sent[0]["additional_data"]["reason"]
    assert max(len(r.getMessage()) for r in caplog.records) < MESSAGE_LIMIT
